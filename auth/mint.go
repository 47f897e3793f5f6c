package auth

import (
	"errors"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// MintKey is the signing key for Mint: Secret for HS256, or PrivateKeyPEM (PKCS#1,
// PKCS#8 or SEC1) for RS256 / ES256 / EdDSA, chosen by the key's type. Exactly one.
type MintKey struct {
	Secret        []byte
	PrivateKeyPEM []byte
}

// Mint signs a token granting claims' Streams, Channels, Publish and Tags (and Subject as
// sub). The claims must pass Claims.Check: a token the server would refuse is not minted.
// iat is now; exp is now+ttl, or absent when ttl is 0 (the verifier must then allow
// tokens without exp); iss and aud are set when non-empty.
func Mint(key MintKey, claims Claims, ttl time.Duration, issuer, audience string, now time.Time) (string, error) {
	if ttl < 0 {
		return "", errors.New("ttl must not be negative")
	}
	if err := claims.Check(); err != nil {
		return "", err
	}
	var (
		method  jwt.SigningMethod
		signKey any
	)
	switch {
	case len(key.Secret) > 0 && len(key.PrivateKeyPEM) > 0:
		return "", errors.New("give a secret or a private key, not both")
	case len(key.Secret) > 0:
		method, signKey = jwt.SigningMethodHS256, key.Secret
	case len(key.PrivateKeyPEM) > 0:
		signer, alg, err := ParsePrivateKeyPEM(key.PrivateKeyPEM)
		if err != nil {
			return "", err
		}
		signKey = signer
		switch alg {
		case AlgRS256:
			method = jwt.SigningMethodRS256
		case AlgES256:
			method = jwt.SigningMethodES256
		case AlgEdDSA:
			method = jwt.SigningMethodEdDSA
		}
	default:
		return "", errors.New("no signing key: need a secret or a private key")
	}
	wc := wireClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:  claims.Subject,
			Issuer:   issuer,
			IssuedAt: jwt.NewNumericDate(now),
		},
		PGSSE: wirePGSSE{Streams: claims.Streams, Channels: claims.Channels, Publish: claims.Publish, Tags: claims.Tags},
	}
	if ttl > 0 {
		wc.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	}
	if audience != "" {
		wc.Audience = jwt.ClaimStrings{audience}
	}
	return jwt.NewWithClaims(method, wc).SignedString(signKey)
}
