package main

import (
	"fmt"
	"io"
	"time"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/names"
)

// maxTokenPatterns bounds what one minted token may carry (it travels in a header).
const maxTokenPatterns = 256

// cmdToken runs `pgsse token --stream P… [--channel C…] [--publish P…] [--tag T…] [--ttl 1h]`: it mints
// with the key `pgsse serve` is configured with and prints only the token.
func cmdToken(args []string, env func(string) (string, bool), stdout io.Writer, now time.Time) error {
	c := newCLI("token", "--stream|--channel|--publish PATTERN… [flags]", env)
	streams := c.Multi("stream", "stream `PATTERN` to grant: a name, or a prefix ending in \"*\" (repeatable)")
	channels := c.Multi("channel", "raw channel `PATTERN` to grant (repeatable)")
	publish := c.Multi("publish", "stream `PATTERN` to grant publishing to (POST /streams, /publish; repeatable)")
	tags := c.Multi("tag", "audience `TAG` the token carries (repeatable)")
	subject := c.String("subject", "", "`SUB` claim: the subject that presence lists and --max-connections-per-subject counts (else logs only)")
	ttl := c.Duration("ttl", time.Hour, "lifetime (0 = no exp; the server then needs --jwt-allow-no-exp)")
	secretFlag := c.String("jwt-secret", "", "HS256 `SECRET`")
	secretFile := c.String("jwt-secret-file", "", "`FILE` holding the HS256 secret")
	keyFile := c.String("private-key-file", "", "PEM private key `FILE` (RSA, EC P-256 or Ed25519) for RS256/ES256/EdDSA")
	issuer := c.String("jwt-issuer", "", "`ISS` claim")
	audience := c.String("jwt-audience", "", "`AUD` claim")
	c.exclusive("jwt-secret", "jwt-secret-file", "private-key-file")
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	if err := c.noArgs(pos); err != nil {
		return err
	}
	if len(*streams) == 0 && len(*channels) == 0 && len(*publish) == 0 {
		return configErrorf("token: give at least one --stream, --channel or --publish")
	}
	if n := len(*streams) + len(*channels) + len(*publish) + len(*tags); n > maxTokenPatterns {
		return configErrorf("token: %d patterns and tags; at most %d", n, maxTokenPatterns)
	}
	for _, p := range *streams {
		if err := checkStreamPattern(p); err != nil {
			return configErrorf("%s: %v", c.source("stream"), err)
		}
	}
	for _, p := range *channels {
		if err := checkChannelPattern(p); err != nil {
			return configErrorf("%s: %v", c.source("channel"), err)
		}
	}
	for _, p := range *publish {
		if err := checkStreamPattern(p); err != nil {
			return configErrorf("%s: %v", c.source("publish"), err)
		}
	}
	for _, tag := range *tags {
		if err := names.CheckTag(tag); err != nil {
			return configErrorf("%s: tag %q: %v", c.source("tag"), tag, err)
		}
	}
	if *ttl < 0 {
		return configErrorf("%s: must not be negative", c.source("ttl"))
	}
	secret, err := c.secret(*secretFlag, *secretFile)
	if err != nil {
		return err
	}
	var key auth.MintKey
	switch {
	case secret != nil && *keyFile != "":
		return configErrorf("%s and %s are mutually exclusive", c.source("private-key-file"), secretSource(c))
	case secret != nil:
		key.Secret = secret
	case *keyFile != "":
		pem, err := c.readKeyFile("private-key-file", *keyFile)
		if err != nil {
			return err
		}
		if _, _, err := auth.ParsePrivateKeyPEM(pem); err != nil {
			return configErrorf("%s: %v", c.source("private-key-file"), err)
		}
		key.PrivateKeyPEM = pem
	default:
		return configErrorf("no JWT key: set --jwt-secret, --jwt-secret-file or --private-key-file")
	}
	tok, err := auth.Mint(key, auth.Claims{Streams: *streams, Channels: *channels, Publish: *publish, Tags: *tags, Subject: *subject},
		*ttl, *issuer, *audience, now)
	if err != nil {
		return configErrorf("token: %v", err)
	}
	_, err = fmt.Fprintln(stdout, tok)
	return err
}

func secretSource(c *cli) string {
	if c.isSet("jwt-secret") {
		return c.source("jwt-secret")
	}
	return c.source("jwt-secret-file")
}
