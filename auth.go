// auth.go is who may call: accounts and their environments (tenants), API keys and their
// scopes, the wrappers that check a key, and the per-key rate limit.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// tenantID is an account and one of its environments: resources and keys belong to one.
type tenantID struct{ account, environment string }

func (id tenantID) String() string { return id.account + "/" + id.environment }

// tenant holds one account's resources in one environment, read-only after load, and
// its sandbox clock, the one value that changes.
type tenant struct {
	id        tenantID
	live      bool
	shipments shipmentIndex
	orders    orderIndex
	clock     sandboxClock
}

// sandboxClock is a tenant's clock, like Stripe's test clocks: it follows the wall clock
// until a test freezes it at an instant, past or future. What a read shows (events, orders,
// a key's expiry) is what exists at the tenant's clock. Reading it is one atomic load.
type sandboxClock struct {
	frozen atomic.Pointer[time.Time] // nil: it follows the wall clock
}

// clockReading is one reading of a tenant's clock: the instant it showed, and whether it
// was frozen there. A request reads its tenant's clock once, when its key is found, and
// that reading judges everything it answers: two readings could disagree.
type clockReading struct {
	now    time.Time
	frozen bool
}

func (c *sandboxClock) read(wall func() time.Time) clockReading {
	if f := c.frozen.Load(); f != nil {
		return clockReading{*f, true}
	}
	return clockReading{wall(), false}
}

// freeze stops the clock at at; a nil at makes it follow the wall clock again.
func (c *sandboxClock) freeze(at *time.Time) { c.frozen.Store(at) }

// tenants are a dataset's declared accounts and environments, by id and in the order the
// dataset declares them.
type tenants struct {
	byID map[tenantID]*tenant
	list []*tenant
}

func newTenants() tenants { return tenants{byID: map[tenantID]*tenant{}} }

var environments = []string{"test", "live"}

type accountRecord struct {
	ID           string   `json:"id"`
	Environments []string `json:"environments"`
}

// addAccount declares an account's environments as tenants.
func (ts *tenants) addAccount(path string, rec accountRecord) error {
	if err := checkID(path+".id", rec.ID); err != nil {
		return err
	}
	if len(rec.Environments) == 0 {
		return &datasetError{path: path + ".environments", reason: "at least one environment (test or live) is required"}
	}
	for j, env := range rec.Environments {
		epath := fmt.Sprintf("%s.environments[%d]", path, j)
		if err := oneOf(epath, "environment", env, environments); err != nil {
			return err
		}
		id := tenantID{rec.ID, env}
		if ts.byID[id] != nil {
			return &datasetError{path: epath, reason: fmt.Sprintf("duplicate: %s is declared more than once", id)}
		}
		t := &tenant{id: id, live: env == "live", shipments: newShipmentIndex(), orders: newOrderIndex(tagOf("tenant", rec.ID, env))}
		ts.byID[id] = t
		ts.list = append(ts.list, t)
	}
	return nil
}

// find is the declared tenant a resource or key at path names.
func (ts tenants) find(path, account, environment string) (*tenant, error) {
	if err := required(path+".account", account); err != nil {
		return nil, err
	}
	if err := required(path+".environment", environment); err != nil {
		return nil, err
	}
	if t := ts.byID[tenantID{account, environment}]; t != nil {
		return t, nil
	}
	for id := range ts.byID {
		if id.account == account {
			return nil, &datasetError{path: path + ".environment", reason: fmt.Sprintf("account %q declares no environment %q in $.accounts", account, environment)}
		}
	}
	return nil, &datasetError{path: path + ".account", reason: fmt.Sprintf("account %q is not declared in $.accounts", account)}
}

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

// keyLine is what the start-up banner says of a key: the one place its text is kept.
type keyLine struct {
	key, scopes, state string
	tenant             tenantID
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

// addKey checks one dataset key and keeps only its digest; the banner line it returns is the
// one place its text goes.
// firstUse holds the path of each key's digest seen so far; the banner states the key as
// it is at the start instant.
func (kr keyring) addKey(path string, rec keyRecord, t *tenant, firstUse map[[sha256.Size]byte]string, start time.Time) (keyLine, error) {
	if err := checkID(path+".key", rec.Key); err != nil {
		return keyLine{}, err
	}
	if !isBearerToken(rec.Key) {
		return keyLine{}, &datasetError{path: path + ".key", reason: "not sendable as a Bearer credential: use letters, digits and - . _ ~ + / (then = padding only)"}
	}
	digest := sha256.Sum256([]byte(rec.Key))
	if first, dup := firstUse[digest]; dup {
		return keyLine{}, &datasetError{path: path + ".key", reason: "duplicate: the same key as " + first}
	}
	firstUse[digest] = path
	k := &apiKey{tenant: t, revoked: rec.Revoked}
	for i, name := range rec.Scopes {
		if err := oneOf(path+".scopes["+strconv.Itoa(i)+"]", "scope", name, scopeNames); err != nil {
			return keyLine{}, err
		}
		for bit, n := range scopeNames {
			if n == name {
				k.scopes |= 1 << bit
			}
		}
	}
	line := keyLine{key: rec.Key, tenant: t.id, scopes: k.scopes.String(), state: "active"}
	if rec.ExpiresAt != nil {
		at, err := timestampField(path+".expires_at", *rec.ExpiresAt)
		if err != nil {
			return keyLine{}, err
		}
		k.expiresAt = at
		line.state = "expires " + formatTimestamp(at)
		if !start.Before(at) {
			line.state = "expired " + formatTimestamp(at)
		}
	}
	switch {
	case rec.Revoked:
		line.state = "revoked"
	case t.live:
		line.state = "live: every call answers 503"
	}
	kr[digest] = k
	return line, nil
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

// call is one request to the service as its wrappers see it, handed from one to the next:
// its id (in the answer and the log), the key that made it and its tenant's clock once
// requireKey has found one, the instant its resources are judged at, and the status it
// was answered with.
type call struct {
	id     string
	key    *apiKey
	clock  clockReading // the tenant's clock, read once when the key was found
	at     time.Time    // what the answer shows is judged at this instant: clock.now, or Prefer's clock
	status int
}

// callHandler is a handler that is handed the request's call.
type callHandler func(w http.ResponseWriter, r *http.Request, c *call)

// wrapper is one check a request passes on its way to its handler: it answers, or hands
// the request on to next.
type wrapper func(next callHandler) callHandler

// chain wraps h in ws, the first outermost: a request passes them in the order listed.
func chain(h callHandler, ws ...wrapper) callHandler {
	for i := len(ws) - 1; i >= 0; i-- {
		h = ws[i](h)
	}
	return h
}

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
func bearerToken(h http.Header) (string, error) {
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

// authenticate finds the key a request carries, unless it is unknown or revoked; its
// expiry is judged by the caller, at the instant the caller reads.
func (kr keyring) authenticate(h http.Header) (*apiKey, error) {
	token, err := bearerToken(h)
	if err != nil {
		return nil, err
	}
	k := kr[sha256.Sum256([]byte(token))]
	switch {
	case k == nil:
		return nil, errUnknownKey
	case k.revoked:
		return nil, errRevokedKey
	}
	return k, nil
}

// expiredAt reports whether the key has expired at at: at and after its expires_at.
func (k *apiKey) expiredAt(at time.Time) bool {
	return !k.expiresAt.IsZero() && !at.Before(k.expiresAt)
}

// wwwAuthenticate is the header's key as Header holds it: Header.Set would canonicalize
// it anew, with an allocation, at every refusal. Its values are shared, never modified.
var (
	wwwAuthenticate = http.CanonicalHeaderKey("WWW-Authenticate")
	bearerRealm     = []string{`Bearer realm="sandbox"`}
)

// requireKey answers 401 unless the request carries an active key, which it hands on with
// its tenant's clock, read once. A key's expiry is judged by that reading, or, for the clock
// operations (expiryByWall), by the wall clock, so that a tenant can always move its clock back.
func requireKey(keys keyring, wall func() time.Time, expiryByWall bool) wrapper {
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			k, err := keys.authenticate(r.Header)
			if err == nil {
				c.clock = k.tenant.clock.read(wall)
				c.at = c.clock.now
				judged := c.clock.now
				if expiryByWall {
					judged = wall()
				}
				if k.expiredAt(judged) {
					err = errExpiredKey
				}
			}
			if err != nil {
				w.Header()[wwwAuthenticate] = bearerRealm
				writeProblem(w, c.id, err)
				return
			}
			c.key = k
			next(w, r, c)
		}
	}
}

// refuseLive answers 503 to a live-environment key: live requests are not released.
func refuseLive(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if c.key.tenant.live {
			writeProblem(w, c.id, errLive)
			return
		}
		next(w, r, c)
	}
}

// requireScope answers 403 unless the key holds the operation's scope.
func requireScope(need scope) wrapper {
	challenge := []string{`Bearer error="insufficient_scope", scope="` + need.String() + `"`}
	err := &apiError{code: codeInsufficientScope, detail: "The API key lacks the " + need.String() + " scope this operation requires."}
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			if c.key.scopes&need == 0 {
				w.Header()[wwwAuthenticate] = challenge
				writeProblem(w, c.id, err)
				return
			}
			next(w, r, c)
		}
	}
}

// rateLimit is the sandbox's per-key limit: perSecond requests a second with a burst of one
// second's worth. It is run as the generic cell rate algorithm, so that a key's bucket is a
// single atomic word and no request waits on a lock.
type rateLimit struct {
	interval int64 // nanoseconds per request
	burst    int64 // nanoseconds of credit a full bucket holds: one second's worth
	epoch    time.Time
	policy   string // the RateLimit-Policy value
}

// maxRate bounds -rate so that a request's interval is at least a nanosecond.
const maxRate = int(time.Second)

func newRateLimit(perSecond int, epoch time.Time) *rateLimit {
	if perSecond <= 0 {
		return nil
	}
	interval := int64(time.Second) / int64(perSecond)
	return &rateLimit{
		interval: interval,
		burst:    interval * int64(perSecond),
		epoch:    epoch,
		policy:   `"default";q=` + strconv.Itoa(perSecond) + `;w=1`,
	}
}

// bucket holds the theoretical arrival time of the next request, in nanoseconds since the
// limiter's epoch.
type bucket struct{ tat atomic.Int64 }

// take spends one request from b at now. It reports the requests left, or, when none is
// left, false and how long until one is.
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
// answer to a keyed call from here on (IETF draft RateLimit header fields). A full bucket
// is one second's worth, so the time until it is full again (t) is always 1 second.
func limitRate(l *rateLimit, now func() time.Time) wrapper {
	return func(next callHandler) callHandler {
		if l == nil {
			return next
		}
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			remaining, ok, wait := l.take(&c.key.bucket, now())
			h := w.Header()
			h.Set("RateLimit-Policy", l.policy)
			h.Set("RateLimit", `"default";r=`+strconv.Itoa(remaining)+`;t=1`)
			if !ok {
				h.Set("Retry-After", strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
				writeProblem(w, c.id, errRateLimit)
				return
			}
			next(w, r, c)
		}
	}
}

// The clock operations (test helpers, not API writes): GET and POST /v1/test_helpers/clock.

// clockAnswer is what both clock operations answer: the clock as it now is.
type clockAnswer struct {
	FrozenTime *string `json:"frozen_time"`
	Now        string  `json:"now"`
	StartedAt  string  `json:"started_at"`
}

// clockHelpers serve the clock operations of every tenant.
type clockHelpers struct {
	started time.Time // the start instant
	wall    func() time.Time
}

// get answers GET /v1/test_helpers/clock: the tenant's clock as the request read it.
func (h clockHelpers) get(w http.ResponseWriter, r *http.Request, c *call) error {
	return h.write(w, c.clock)
}

// set answers POST /v1/test_helpers/clock: it freezes the tenant's clock at the body's
// frozen_time, or lets it follow the wall clock again (null), and answers the clock it set.
// A body that is refused changes nothing.
func (h clockHelpers) set(w http.ResponseWriter, r *http.Request, c *call) error {
	b, err := io.ReadAll(r.Body) // in memory: readBody read it
	if err != nil {
		return err
	}
	frozen, err := parseClockBody(b)
	if err != nil {
		return err
	}
	c.key.tenant.clock.freeze(frozen)
	set := clockReading{frozen: frozen != nil}
	if set.frozen {
		set.now = *frozen
	} else {
		set.now = h.wall()
	}
	return h.write(w, set)
}

// write answers with one reading of a tenant's clock: frozen_time and now always agree.
func (h clockHelpers) write(w http.ResponseWriter, clock clockReading) error {
	a := clockAnswer{Now: formatTimestamp(clock.now), StartedAt: formatTimestamp(h.started)}
	if clock.frozen {
		a.FrozenTime = &a.Now
	}
	b, err := marshalJSON(a)
	if err != nil {
		return err
	}
	writeBody(w, http.StatusOK, jsonContentType, []string{strconv.Itoa(len(b))}, b)
	return nil
}

var (
	errClockBody    = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, such as {"frozen_time":"2026-03-29T01:00:00Z"} or {"frozen_time":null}.`}
	errFrozenTime   = paramError(codeInvalidParameter, "frozen_time", "frozen_time must be an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z, or null to follow the wall clock.")
	errFrozenTwice  = paramError(codeInvalidParameter, "frozen_time", "frozen_time is given more than once; give it once.")
	errFrozenAbsent = paramError(codeInvalidParameter, "frozen_time", `frozen_time is required: an RFC 3339 timestamp with an offset, or null to follow the wall clock.`)
)

// parseClockBody reads a POST /v1/test_helpers/clock body, {"frozen_time": "<RFC 3339>"} or
// {"frozen_time": null}: its JSON syntax first (400), then its members in the order sent
// (422), then whether frozen_time was there. A nil instant means the wall clock.
func parseClockBody(b []byte) (*time.Time, error) {
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	if !utf8.Valid(b) || !json.Valid(b) || len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errClockBody
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.Token() // {
	var frozen *time.Time
	seen := false
	for dec.More() {
		tok, _ := dec.Token()
		var value json.RawMessage
		dec.Decode(&value)
		switch name := tok.(string); {
		case name != "frozen_time":
			return nil, paramError(codeUnknownParameter, name, "Unknown member "+strconv.Quote(name)+": the body has frozen_time only.")
		case seen:
			return nil, errFrozenTwice
		}
		seen = true
		if string(value) == "null" {
			continue
		}
		var s string
		if json.Unmarshal(value, &s) != nil {
			return nil, errFrozenTime
		}
		at, err := parseTimestamp(s)
		if err != nil {
			return nil, errFrozenTime
		}
		frozen = &at
	}
	if !seen {
		return nil, errFrozenAbsent
	}
	return frozen, nil
}
