package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
)

// MinRSABits is the smallest RSA modulus accepted for signing or verifying.
const MinRSABits = 2048

// Algorithms, as they appear in a token's "alg" header.
const (
	AlgHS256 = "HS256"
	AlgRS256 = "RS256"
	AlgES256 = "ES256"
	AlgEdDSA = "EdDSA"
)

// ParsePublicKeyPEM reads the first key in a PEM file: a PKIX "PUBLIC KEY", a PKCS#1
// "RSA PUBLIC KEY" or a "CERTIFICATE" (its subject key). It returns the key and the one
// algorithm that key verifies: RSA → RS256, ECDSA P-256 → ES256, Ed25519 → EdDSA.
// Errors name the problem without a prefix, e.g. "no PEM block", so the caller can put the
// flag or file name in front.
func ParsePublicKeyPEM(data []byte) (crypto.PublicKey, string, error) {
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, "", errors.New("no PEM block")
		}
		var key any
		var err error
		switch b.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(b.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			cert, err = x509.ParseCertificate(b.Bytes)
			if err == nil {
				key = cert.PublicKey
			}
		case "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY":
			return nil, "", fmt.Errorf("PEM block %q is a private key: give the public key (e.g. openssl pkey -pubout)", b.Type)
		default:
			continue // e.g. "EC PARAMETERS"
		}
		if err != nil {
			return nil, "", fmt.Errorf("PEM block %q does not hold a valid key", b.Type)
		}
		alg, err := publicAlg(key)
		if err != nil {
			return nil, "", err
		}
		return key, alg, nil
	}
}

// ParsePrivateKeyPEM reads the first private key in a PEM file: PKCS#1 "RSA PRIVATE KEY",
// PKCS#8 "PRIVATE KEY" or SEC1 "EC PRIVATE KEY". It returns the key and the algorithm it
// signs with (RS256, ES256 for P-256, EdDSA for Ed25519). Encrypted keys are refused.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, string, error) {
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, "", errors.New("no PEM block")
		}
		var key any
		var err error
		switch b.Type {
		case "RSA PRIVATE KEY":
			if _, enc := b.Headers["DEK-Info"]; enc {
				return nil, "", errors.New("encrypted private keys are not supported")
			}
			key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			if _, enc := b.Headers["DEK-Info"]; enc {
				return nil, "", errors.New("encrypted private keys are not supported")
			}
			key, err = x509.ParseECPrivateKey(b.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, "", errors.New("encrypted private keys are not supported")
		case "PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE":
			return nil, "", fmt.Errorf("PEM block %q is not a private key", b.Type)
		default:
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("PEM block %q does not hold a valid key", b.Type)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, "", fmt.Errorf("unsupported key type %T", key)
		}
		alg, err := publicAlg(signer.Public())
		if err != nil {
			return nil, "", err
		}
		return signer, alg, nil
	}
}

// publicAlg is the single place that binds a key family to its algorithm.
func publicAlg(key any) (string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < MinRSABits {
			return "", errors.New("RSA key has " + strconv.Itoa(bits) + " bits; at least " +
				strconv.Itoa(MinRSABits) + " are required")
		}
		return AlgRS256, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", fmt.Errorf("unsupported EC curve %s: ES256 needs P-256", k.Curve.Params().Name)
		}
		return AlgES256, nil
	case ed25519.PublicKey:
		return AlgEdDSA, nil
	default:
		return "", fmt.Errorf("unsupported key type %T (use RSA, EC P-256 or Ed25519)", key)
	}
}
