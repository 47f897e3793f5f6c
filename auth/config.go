package auth

// Config selects how tokens are verified (docs/http.md, Authorization). Filled by cmd/pgsse
// from --jwt-secret/--jwt-secret-file/--jwt-public-key-file/--jwt-issuer/--jwt-audience/
// --jwt-allow-no-exp.
type Config struct {
	Secret       []byte // HS256 key
	PublicKeyPEM []byte // RS256 / ES256 / EdDSA public key, PEM
	Issuer       string // checked when non-empty
	Audience     string // checked when non-empty
	AllowNoExp   bool   // accept tokens without exp
}
