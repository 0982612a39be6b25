package main

import (
	"crypto/sha256"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// scope is a permission a key may hold; each operation requires one.
type scope uint8

const (
	scopeTrackingRead scope = 1 << iota
	scopeOrdersRead
)

// scopeNames are the wire names of the scopes: the scope with bit i is scopeNames[i].
var scopeNames = []string{"tracking:read", "orders:read"}

func (s scope) String() string {
	var names []string
	for i, name := range scopeNames {
		if s&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, " ")
}

// apiKey is a key as the server holds it: only the SHA-256 digest of the secret is kept.
type apiKey struct {
	digest    [sha256.Size]byte
	tenant    *tenant // the account and environment the key is tied to
	scopes    scope
	expiresAt time.Time // zero: never expires
	revoked   bool
	bucket    bucket // the key's rate-limit state
}

// keyring finds a key by the digest of the presented secret. Looking a digest up in a map
// is the constant-time comparison here: the time taken depends on the digest, which a
// client cannot steer towards a real key's digest without knowing the key, so it reveals
// nothing about any key (the same reasoning as for stored password hashes).
type keyring map[[sha256.Size]byte]*apiKey

var (
	errMissingKey = &apiError{code: codeMissingAPIKey, detail: "Send an API key as Authorization: Bearer <API_KEY>."}
	errEmptyKey   = &apiError{code: codeInvalidAPIKey, detail: "The Bearer credential is empty. Send Authorization: Bearer <API_KEY>."}
	errTwoKeys    = &apiError{code: codeInvalidAPIKey, detail: "Send exactly one Authorization header."}
	errUnknownKey = &apiError{code: codeInvalidAPIKey, detail: "The API key is not valid. Check it for typos; sandbox keys are printed when the sandbox starts."}
	errExpiredKey = &apiError{code: codeExpiredAPIKey, detail: "The API key has expired. Use an active key."}
	errRevokedKey = &apiError{code: codeRevokedAPIKey, detail: "The API key has been revoked. Use an active key."}
	errLive       = &apiError{code: codeLiveNotReleased, detail: "Live requests are not released; this is a live-environment key. Use a test key with the local sandbox."}
	errRateLimit  = &apiError{code: codeRateLimited, detail: "The sandbox rate limit for this key is reached. Retry after the Retry-After seconds."}
)

// bearerToken reads the API key from the Authorization header (RFC 6750, section 2.1; the
// scheme name is case-insensitive, RFC 9110 section 11.1).
func bearerToken(h http.Header) (string, *apiError) {
	fields := h["Authorization"]
	if len(fields) == 0 {
		return "", errMissingKey
	}
	if len(fields) > 1 {
		return "", errTwoKeys
	}
	scheme, token, _ := strings.Cut(fields[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errMissingKey
	}
	token = strings.TrimLeft(token, " ")
	if token == "" {
		return "", errEmptyKey
	}
	return token, nil
}

// requireKey answers 401 unless the request carries an active key, and remembers the key
// for the wrappers and handler after it.
func (s *server) requireKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := bearerToken(r.Header)
		var k *apiKey
		if err == nil {
			k = s.keys[sha256.Sum256([]byte(token))]
			switch {
			case k == nil:
				err = errUnknownKey
			case k.revoked:
				err = errRevokedKey
			case !k.expiresAt.IsZero() && !s.now().Before(k.expiresAt):
				err = errExpiredKey
			}
		}
		if err != nil {
			w.Header()["Www-Authenticate"] = bearerRealm
			writeError(w, err)
			return
		}
		exchangeOf(w).key = k
		next.ServeHTTP(w, r)
	})
}

// refuseLive answers 503 to a live-environment key: live requests are not released.
func refuseLive(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exchangeOf(w).key.tenant.live {
			writeError(w, errLive)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requireScope answers 403 unless the key holds the operation's scope.
func requireScope(need scope, next http.Handler) http.Handler {
	challenge := []string{`Bearer error="insufficient_scope", scope="` + need.String() + `"`}
	err := &apiError{code: codeInsufficientScope, detail: "The API key lacks the " + need.String() + " scope this operation requires."}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exchangeOf(w).key.scopes&need == 0 {
			w.Header()["Www-Authenticate"] = challenge
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// rateLimit is the sandbox's per-key limit: a token bucket of perSecond tokens a second with
// a burst of one second's worth, run as the generic cell rate algorithm so that a bucket
// is a single atomic word and no request waits on a lock.
type rateLimit struct {
	perSecond int
	interval  int64 // nanoseconds per token
	burst     int64 // nanoseconds of credit a full bucket holds: one second's worth
	epoch     time.Time
	policy    []string   // RateLimit-Policy value
	remaining [][]string // RateLimit value for each remaining count
}

// maxRate bounds -rate so that every RateLimit value can be prepared at start-up.
const maxRate = 10000

func newRateLimit(perSecond int, epoch time.Time) *rateLimit {
	if perSecond <= 0 {
		return nil
	}
	l := &rateLimit{
		perSecond: perSecond,
		interval:  int64(time.Second) / int64(perSecond),
		epoch:     epoch,
		policy:    []string{`"default";q=` + strconv.Itoa(perSecond) + `;w=1`},
		remaining: make([][]string, perSecond+1),
	}
	l.burst = l.interval * int64(perSecond)
	// A full bucket is one second's worth, so the time until it is full again is always
	// more than zero and at most one second: the reset (t) is always 1 whole second.
	for r := range l.remaining {
		l.remaining[r] = []string{`"default";r=` + strconv.Itoa(r) + `;t=1`}
	}
	return l
}

// bucket holds the theoretical arrival time of the next request, in nanoseconds since the
// limiter's epoch.
type bucket struct{ tat atomic.Int64 }

// take spends one token from b at now. It reports the tokens left, or, when none is left,
// false and how long until one is.
func (l *rateLimit) take(b *bucket, now time.Time) (remaining int, ok bool, wait time.Duration) {
	t := now.Sub(l.epoch).Nanoseconds()
	for {
		old := b.tat.Load()
		next := max(old, t) + l.interval
		if next-t > l.burst {
			return 0, false, time.Duration(next - t - l.burst)
		}
		if b.tat.CompareAndSwap(old, next) {
			return int((l.burst - (next - t)) / l.interval), true, 0
		}
	}
}

// limitRate answers 429 when the key's bucket is empty, and states the limit on every
// answer to a keyed call from here on (IETF draft RateLimit header fields).
func (s *server) limitRate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.rate == nil {
			next.ServeHTTP(w, r)
			return
		}
		remaining, ok, wait := s.rate.take(&exchangeOf(w).key.bucket, s.now())
		h := w.Header()
		h["Ratelimit-Policy"] = s.rate.policy
		h["Ratelimit"] = s.rate.remaining[remaining]
		if !ok {
			h["Retry-After"] = []string{strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10)}
			writeError(w, errRateLimit)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// keyRecord is a key as the dataset holds it.
type keyRecord struct {
	Key         string   `json:"key"`
	Account     string   `json:"account"`
	Environment string   `json:"environment"`
	Scopes      []string `json:"scopes"`
	ExpiresAt   *string  `json:"expires_at"`
	Revoked     bool     `json:"revoked"`
}

// loadKey checks one dataset key and keeps only its digest; the banner line is the one
// place its text goes.
func loadKey(path string, rec keyRecord, t *tenant) (*apiKey, keyLine, error) {
	if err := required(path, "key", rec.Key); err != nil {
		return nil, keyLine{}, err
	}
	if !isBearerToken(rec.Key) {
		return nil, keyLine{}, &datasetError{path: path + ".key", reason: "not sendable as a Bearer credential: use letters, digits and - . _ ~ + / (then = padding only)"}
	}
	k := &apiKey{digest: sha256.Sum256([]byte(rec.Key)), tenant: t, revoked: rec.Revoked}
	for i, name := range rec.Scopes {
		if err := oneOf(path+".scopes["+strconv.Itoa(i)+"]", "scope", name, scopeNames); err != nil {
			return nil, keyLine{}, err
		}
		k.scopes |= 1 << slices.Index(scopeNames, name)
	}
	line := keyLine{key: rec.Key, tenant: t.id.String(), scopes: k.scopes.String(), state: "active"}
	if rec.ExpiresAt != nil {
		at, err := timestampField(path+".expires_at", *rec.ExpiresAt)
		if err != nil {
			return nil, keyLine{}, err
		}
		k.expiresAt = at
		line.state = "expires " + formatTimestamp(at)
	}
	switch {
	case rec.Revoked:
		line.state = "revoked"
	case t.live:
		line.state = "live: every call answers 503 (live requests are not released)"
	}
	return k, line, nil
}

// isBearerToken reports whether s is an RFC 6750 b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isBearerToken(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return false
		}
	}
	return true
}
