// auth.go is who may call and when: accounts and their environments (tenants), with the
// dataset's records filed under them; API keys and their scopes; the per-key rate limit;
// and each tenant's sandbox clock with its operations.
package main

import (
	"bytes"
	"container/list"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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
	timeline  []happening // what the dataset schedules for its shipments and orders, in order
	clock     sandboxClock
	sequences sequences     // Prefer: code=503; times=2, counted
	faulted   atomic.Uint64 // the requests -faults has judged, the k of the next is this plus one
}

// sandboxClock is a tenant's clock, like Stripe's test clocks: it follows the wall clock
// until a test freezes it at an instant, past or future, or sets it running from an
// instant at the wall clock's pace (to watch a timeline already past again). What a read
// shows (events, orders, a key's expiry) is what exists at the tenant's clock. Reading it
// is one atomic load.
type sandboxClock struct {
	setting atomic.Pointer[clockSetting] // nil: it follows the wall clock
}

// clockSetting is how a clock was set: frozen at at, or running from at since the wall
// clock read since.
type clockSetting struct {
	at      time.Time
	running bool
	since   time.Time
}

// clockReading is one reading of a tenant's clock: the instant it showed, and how it was
// set then. A request reads its tenant's clock once, when its key is found, and that
// reading judges everything it answers: two readings could disagree.
type clockReading struct {
	now         time.Time
	frozen      bool
	running     bool
	runningFrom time.Time // when running: the instant it was set to run from
}

func (c *sandboxClock) read(wall func() time.Time) clockReading {
	switch set := c.setting.Load(); {
	case set == nil:
		return clockReading{now: wall()}
	case set.running:
		return clockReading{now: set.at.Add(wall().Sub(set.since)), running: true, runningFrom: set.at}
	default:
		return clockReading{now: set.at, frozen: true}
	}
}

// freeze stops the clock at at.
func (c *sandboxClock) freeze(at time.Time) { c.setting.Store(&clockSetting{at: at}) }

// timelineAround is the last n things the tenant's dataset schedules at or before at and
// the next n after it, oldest first, and how many more there are on each side: a search of
// the timeline, and counts by subtraction.
func (t *tenant) timelineAround(at time.Time, n int) (past, future []happening, morePast, moreFuture int) {
	k := sort.Search(len(t.timeline), func(k int) bool { return t.timeline[k].at.After(at) })
	past, future = t.timeline[max(0, k-n):k], t.timeline[k:min(len(t.timeline), k+n)]
	return past, future, k - len(past), len(t.timeline) - k - len(future)
}

// timelineSide is how many entries of a timeline are shown each side of an instant: by the
// page and by GET /v1/test_helpers/timeline.
const timelineSide = 10

// timelineEntry is a happening as GET /v1/test_helpers/timeline answers it.
type timelineEntry struct {
	At     string  `json:"at"`
	Kind   string  `json:"kind"`
	ID     string  `json:"id"`
	Status *string `json:"status"` // null for a shipment's creation
}

// timelineAnswer is GET /v1/test_helpers/timeline's answer, its members in this order.
type timelineAnswer struct {
	Now        string          `json:"now"`
	Shown      []timelineEntry `json:"shown"`
	ShownMore  int             `json:"shown_more"`
	ToCome     []timelineEntry `json:"to_come"`
	ToComeMore int             `json:"to_come_more"`
}

// timelineAt is GET /v1/test_helpers/timeline's answer at at: the last timelineSide things
// the tenant's dataset schedules at or before it and the next after it, oldest first, with
// how many more there are each side.
func (t *tenant) timelineAt(at time.Time) ([]byte, error) {
	past, future, morePast, moreFuture := t.timelineAround(at, timelineSide)
	return marshalJSON(timelineAnswer{Now: formatTimestamp(at), Shown: timelineEntries(past), ShownMore: morePast, ToCome: timelineEntries(future), ToComeMore: moreFuture})
}

func timelineEntries(hs []happening) []timelineEntry {
	entries := make([]timelineEntry, 0, len(hs))
	for _, h := range hs {
		e := timelineEntry{At: formatTimestamp(h.at), Kind: happeningKinds[h.kind], ID: h.id}
		if h.kind != shipmentCreated {
			e.Status = &h.status
		}
		entries = append(entries, e)
	}
	return entries
}

// sortHappenings puts a timeline in order: oldest first, ties by kind, then id, then as given.
func sortHappenings(h []happening) {
	slices.SortStableFunc(h, func(a, b happening) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		if a.kind != b.kind {
			return int(a.kind) - int(b.kind)
		}
		return strings.Compare(a.id, b.id)
	})
}

// tenants are a dataset's declared accounts and environments, by id and in the order the
// dataset declares them.
type tenants struct {
	byID map[tenantID]*tenant
	list []*tenant
}

var environments = []string{"test", "live"}

// accountRecord is an account as the dataset holds it.
type accountRecord struct {
	ID           string
	Environments []string
}

var accountShape = shapeOf(
	text("id", func(r *accountRecord) *string { return &r.ID }),
	texts("environments", func(r *accountRecord) *[]string { return &r.Environments }),
)

func (rec *accountRecord) decode(d *jsonReader, path string) error {
	return accountShape.read(d, path, rec)
}

// Loading: a loader files each record of a dataset under the tenant it names and hands it
// to the file that owns the record, which checks it. The indexes a loader makes know their
// tenant and the start instant, so that neither travels with each record.

// loader loads one dataset: the instant its relative instants count from, its tenants, and
// its keys, each with where it was first given and what the banner says of it.
type loader struct {
	start    time.Time
	tenants  tenants
	keys     keyring
	keyLines []keyLine
	firstUse map[[sha256.Size]byte]string // the path of each key's digest
}

func newLoader(start time.Time) *loader {
	return &loader{start: start, tenants: tenants{byID: map[tenantID]*tenant{}}, keys: keyring{}, firstUse: map[[sha256.Size]byte]string{}}
}

// addAccounts declares the dataset's accounts and their environments as tenants.
func (ld *loader) addAccounts(list []accountRecord) error {
	if len(list) == 0 {
		return &datasetError{path: "$.accounts", reason: "at least one account is required"}
	}
	for i, rec := range list {
		if err := ld.addAccount("$.accounts["+strconv.Itoa(i)+"]", rec); err != nil {
			return err
		}
	}
	return nil
}

// addAccount declares an account's environments as tenants.
func (ld *loader) addAccount(path string, rec accountRecord) error {
	ts := &ld.tenants
	if err := checkID(path, "id", rec.ID); err != nil {
		return err
	}
	if len(rec.Environments) == 0 {
		return &datasetError{path: path + ".environments", reason: "at least one environment (test or live) is required"}
	}
	for j, env := range rec.Environments {
		epath := fmt.Sprintf("%s.environments[%d]", path, j)
		if _, err := oneOf(epath, "", "environment", env, environments); err != nil {
			return err
		}
		id := tenantID{rec.ID, env}
		if ts.byID[id] != nil {
			return &datasetError{path: epath, reason: fmt.Sprintf("duplicate: %s is declared more than once", id)}
		}
		t := &tenant{id: id, live: env == "live", shipments: newShipmentIndex(id.String(), ld.start), orders: newOrderIndex(rec.ID, env, ld.start)}
		ts.byID[id] = t
		ts.list = append(ts.list, t)
	}
	return nil
}

// find is the declared tenant a resource or key at path names.
func (ts tenants) find(path, account, environment string) (*tenant, error) {
	if err := required(path, "account", account); err != nil {
		return nil, err
	}
	if err := required(path, "environment", environment); err != nil {
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

// Loading: each record of a dataset's lists is decoded, filed under the tenant it names
// and handed to the file that owns it, which checks it.

// record is a dataset record that belongs to an account and environment.
type record interface {
	keyRecord | shipmentRecord
	owner() (account, environment string)
}

func (r keyRecord) owner() (string, string)      { return r.Account, r.Environment }
func (r shipmentRecord) owner() (string, string) { return r.Account, r.Environment }

// eachRecord finds the tenant each record of the dataset's list name belongs to, and hands
// both to add.
func eachRecord[T record](ts *tenants, name string, list []T, add func(path string, rec T, t *tenant) error) error {
	for i, rec := range list {
		path := "$." + name + "[" + strconv.Itoa(i) + "]"
		account, environment := rec.owner()
		t, err := ts.find(path, account, environment)
		if err != nil {
			return err
		}
		if err := add(path, rec, t); err != nil {
			return err
		}
	}
	return nil
}

// loadKeys files the dataset's keys, with what the banner says of each: its state at the
// start instant.
func (ld *loader) loadKeys(list []keyRecord) error {
	return eachRecord(&ld.tenants, "keys", list, func(path string, rec keyRecord, t *tenant) error {
		line, err := ld.addKey(path, rec, t)
		ld.keyLines = append(ld.keyLines, line)
		return err
	})
}

// loadOrders hands each of the dataset's orders to its tenant's orders. Orders mostly come
// in runs of one tenant's, so the tenant of the order before is tried first.
func (ld *loader) loadOrders(rs *orderRecords) error {
	var t *tenant
	for i := range rs.list {
		path := "$.orders[" + strconv.Itoa(i) + "]"
		account, environment := rs.values[rs.list[i].account], rs.values[rs.list[i].environment]
		if t == nil || t.id != (tenantID{account, environment}) {
			var err error
			if t, err = ld.tenants.find(path, account, environment); err != nil {
				return err
			}
		}
		t.orders.recs = rs
		if err := t.orders.addOrder(path, rs, i); err != nil {
			return err
		}
	}
	return nil
}

// loadedShipment is a shipment whose raw events loading left out or showed once.
type loadedShipment struct {
	id     string
	tenant tenantID
	normalization
}

// loadShipments files each of the dataset's shipments under its tenant and makes the link
// to the order it was created with, which must be of the same account and environment. It
// returns the shipments whose raw events were left out or shown once.
func (ld *loader) loadShipments(list []shipmentRecord) ([]loadedShipment, error) {
	var noted []loadedShipment
	err := eachRecord(&ld.tenants, "shipments", list, func(path string, rec shipmentRecord, t *tenant) error {
		s, n, err := t.shipments.addShipment(path, rec)
		if err != nil {
			return err
		}
		if n.dropped > 0 || n.duplicates > 0 {
			noted = append(noted, loadedShipment{rec.ID, t.id, n})
		}
		if rec.OrderID == nil {
			return nil
		}
		if !t.orders.has(*rec.OrderID) {
			// Only a refusal asks the other tenants, to name the order's owner: loading
			// stays linear in the number of tenants.
			for _, other := range ld.tenants.list {
				if other.orders.has(*rec.OrderID) {
					return &datasetError{path: path + ".order_id", reason: fmt.Sprintf("order %q belongs to %s, not to %s: shipment %q cannot be linked across accounts or environments", *rec.OrderID, other.id, t.id, rec.ID)}
				}
			}
		}
		return t.orders.link(path, *rec.OrderID, rec.ID, s.createdAt)
	})
	return noted, err
}

// build prepares each tenant's indexes once every record is filed, and counts what they hold.
func (ld *loader) build() (orders, shipments int, err error) {
	for _, t := range ld.tenants.list {
		t.shipments.build()
		if err := t.orders.build(); err != nil {
			return 0, 0, err
		}
		t.timeline = append(t.shipments.happenings, t.orders.happenings...)
		t.shipments.happenings, t.orders.happenings = nil, nil
		sortHappenings(t.timeline)
		orders += t.orders.count()
		shipments += t.shipments.count()
	}
	return orders, shipments, nil
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
	expiresAt instant // never, when the key has no expiry
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
	Key         string
	Account     string
	Environment string
	Scopes      []string
	ExpiresAt   *string
	Revoked     bool
}

var keyShape = shapeOf(
	text("key", func(r *keyRecord) *string { return &r.Key }),
	shared("account", func(r *keyRecord) *string { return &r.Account }),
	shared("environment", func(r *keyRecord) *string { return &r.Environment }),
	texts("scopes", func(r *keyRecord) *[]string { return &r.Scopes }),
	optional("expires_at", func(r *keyRecord) **string { return &r.ExpiresAt }),
	truth("revoked", func(r *keyRecord) *bool { return &r.Revoked }),
)

func (rec *keyRecord) decode(d *jsonReader, path string) error { return keyShape.read(d, path, rec) }

// addKey checks one dataset key and keeps only its digest. The line it returns, the key's
// text with its state at the start instant, is the one place that text goes: the banner
// and the page.
func (ld *loader) addKey(path string, rec keyRecord, t *tenant) (keyLine, error) {
	firstUse, start := ld.firstUse, ld.start
	if err := checkID(path, "key", rec.Key); err != nil {
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
	k := &apiKey{tenant: t, revoked: rec.Revoked, expiresAt: never}
	for i, name := range rec.Scopes {
		bit, err := oneOf(path, "scopes["+strconv.Itoa(i)+"]", "scope", name, scopeNames)
		if err != nil {
			return keyLine{}, err
		}
		k.scopes |= 1 << bit
	}
	line := keyLine{key: rec.Key, tenant: t.id, scopes: k.scopes.String(), state: "active"}
	if rec.ExpiresAt != nil {
		at, err := timestampField(path, "expires_at", *rec.ExpiresAt)
		if err != nil {
			return keyLine{}, err
		}
		k.expiresAt = instantOf(at)
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
	ld.keys[digest] = k
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

var (
	errMissingKey = &apiError{code: codeMissingAPIKey, detail: "Send an API key as Authorization: Bearer <API_KEY>."}
	errEmptyKey   = &apiError{code: codeInvalidAPIKey, detail: "The Bearer credential is empty. Send Authorization: Bearer <API_KEY>."}
	errTwoKeys    = &apiError{code: codeInvalidAPIKey, detail: "Send exactly one Authorization header."}
	errUnknownKey = &apiError{code: codeInvalidAPIKey, detail: "The API key is not valid. Check it for typos; sandbox keys are printed when the sandbox starts."}
	errExpiredKey = &apiError{code: codeExpiredAPIKey, detail: "The API key has expired. Use an active key."}
	errRevokedKey = &apiError{code: codeRevokedAPIKey, detail: "The API key has been revoked. Use an active key."}
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

// authenticate finds the key a request carries, unless it is unknown or revoked; its
// expiry is judged by the caller, at the instant the caller reads.
func (kr keyring) authenticate(h http.Header) (*apiKey, *apiError) {
	token, fault := bearerToken(h)
	if fault != nil {
		return nil, fault
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
	return !k.expiresAt.after(instantOf(at))
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

// Rehearsals counted: a code that fails only the first N requests of a sequence (Prefer:
// code=503; times=2). The requests of one sequence share the tenant, the method, the
// target as sent and the whole Prefer value.

const (
	sequenceIdle = 60 * time.Second // a sequence is forgotten this long after its last request
	maxSequences = 10000            // a tenant's; a new one beyond forgets the least recently used
)

// sequences are a tenant's sequences, by the SHA-256 digest of their identity, the most
// recently used first. They take memory only as they fill.
type sequences struct {
	mu     sync.Mutex
	byID   map[[sha256.Size]byte]*list.Element
	recent list.List // of *sequence
}

type sequence struct {
	id    [sha256.Size]byte
	count int
	last  time.Time
}

// count counts a request of the sequence id at now and returns how many it has had, this
// one included: 1 for a sequence that is new, or forgotten sequenceIdle after its last.
func (q *sequences) count(id [sha256.Size]byte, now time.Time) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.byID[id]; ok {
		seq := e.Value.(*sequence)
		if now.Sub(seq.last) >= sequenceIdle {
			seq.count = 0
		}
		seq.count, seq.last = seq.count+1, now
		q.recent.MoveToFront(e)
		return seq.count
	}
	if q.byID == nil {
		q.byID = map[[sha256.Size]byte]*list.Element{}
	}
	if q.recent.Len() >= maxSequences {
		oldest := q.recent.Back()
		delete(q.byID, oldest.Value.(*sequence).id)
		q.recent.Remove(oldest)
	}
	q.byID[id] = q.recent.PushFront(&sequence{id: id, count: 1, last: now})
	return 1
}

// held is how many sequences the tenant holds.
func (q *sequences) held() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byID)
}

// sequenceOf is the digest of a request's sequence: its method, its target as sent (path
// and query) and its Prefer fields, joined as one.
func sequenceOf(method, target string, prefer []string) [sha256.Size]byte {
	h := sha256.New()
	io.WriteString(h, method+"\x00"+target+"\x00"+strings.Join(prefer, ", "))
	var id [sha256.Size]byte
	h.Sum(id[:0])
	return id
}

// The clock operations (test helpers, not API writes): GET and POST /v1/test_helpers/clock.

// clockAnswer is what both clock operations answer: the clock as it now is, its members in
// this order.
type clockAnswer struct {
	FrozenTime  *string `json:"frozen_time"`
	RunningFrom *string `json:"running_from"`
	Now         string  `json:"now"`
	StartedAt   string  `json:"started_at"`
}

// clockHelpers serve the clock operations of every tenant.
type clockHelpers struct {
	started time.Time // the start instant
	wall    func() time.Time
}

// get answers GET /v1/test_helpers/clock: the tenant's clock as the request read it.
func (h clockHelpers) get(w http.ResponseWriter, clock clockReading) error {
	return h.write(w, clock)
}

// set answers POST /v1/test_helpers/clock: it freezes the tenant's clock at the body's
// frozen_time, lets it follow the wall clock again (null), or sets it running from
// run_from, and answers the clock it set. A body that is refused changes nothing.
func (h clockHelpers) set(w http.ResponseWriter, r *http.Request, t *tenant) error {
	b, err := io.ReadAll(r.Body) // in memory: readBody read it
	if err != nil {
		return err
	}
	set, err := parseClockBody(b, h.started)
	if err != nil {
		return err
	}
	reading := clockReading{now: h.wall()}
	switch {
	case set == nil:
	case set.running:
		set.since = reading.now
		reading = clockReading{now: set.at, running: true, runningFrom: set.at}
	default:
		reading = clockReading{now: set.at, frozen: true}
	}
	t.clock.setting.Store(set)
	return h.write(w, reading)
}

// write answers with one reading of a tenant's clock: frozen_time and now always agree.
func (h clockHelpers) write(w http.ResponseWriter, clock clockReading) error {
	a := clockAnswer{Now: formatTimestamp(clock.now), StartedAt: formatTimestamp(h.started)}
	if clock.frozen {
		a.FrozenTime = &a.Now
	}
	if clock.running {
		from := formatTimestamp(clock.runningFrom)
		a.RunningFrom = &from
	}
	b, err := marshalJSON(a)
	if err != nil {
		return err
	}
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

var (
	errClockBody    = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, such as {"frozen_time":"2026-03-29T01:00:00Z"}, {"frozen_time":null} or {"run_from":"start"}.`}
	errFrozenTime   = paramError(codeInvalidParameter, "frozen_time", "frozen_time must be an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z, an instant relative to the start instant, such as start+90s, or null to follow the wall clock.")
	errRunFrom      = paramError(codeInvalidParameter, "run_from", "run_from must be an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z, or an instant relative to the start instant, such as start or start+90s: the clock runs from there at the wall clock's pace.")
	errFrozenAbsent = paramError(codeInvalidParameter, "frozen_time", `frozen_time is required: an RFC 3339 timestamp with an offset or an instant relative to the start, or null to follow the wall clock; or run_from, an instant to run from.`)
)

// clockMembers are the members of a clock body: each sets the clock one way.
var clockMembers = []string{"frozen_time", "run_from"}

// parseClockBody reads a POST /v1/test_helpers/clock body, {"frozen_time": <instant>},
// {"frozen_time": null} or {"run_from": <instant>}, instants strict RFC 3339 with an
// offset or relative to start: its JSON syntax first (400), then its members in the order
// sent, each by its name, then whether it is given again, then its value (422); then
// whether both were given (naming the second sent), or neither (frozen_time). A nil
// setting follows the wall clock.
func parseClockBody(b []byte, start time.Time) (*clockSetting, error) {
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	if !utf8.Valid(b) || !json.Valid(b) || len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errClockBody
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.Token() // {
	var set *clockSetting
	var given []string // the clock members, in the order sent
	for dec.More() {
		tok, _ := dec.Token()
		var value json.RawMessage
		dec.Decode(&value)
		name := tok.(string)
		switch {
		case !slices.Contains(clockMembers, name):
			return nil, paramError(codeUnknownParameter, name, "Unknown member "+strconv.Quote(name)+": the body has frozen_time or run_from.")
		case slices.Contains(given, name):
			return nil, paramError(codeInvalidParameter, name, name+" is given more than once; give it once.")
		}
		given = append(given, name)
		var err error
		if set, err = readClockMember(name, value, start); err != nil {
			return nil, err
		}
	}
	switch len(given) {
	case 0:
		return nil, errFrozenAbsent
	case 2:
		return nil, paramError(codeInvalidParameter, given[1], "The body sets the clock one way: give frozen_time or run_from, not both.")
	}
	return set, nil
}

// readClockMember reads the value of a clock member: frozen_time, an instant or null (the
// wall clock); run_from, an instant.
func readClockMember(name string, value json.RawMessage, start time.Time) (*clockSetting, error) {
	fault := errFrozenTime
	if name == "run_from" {
		fault = errRunFrom
	}
	if string(value) == "null" && name == "frozen_time" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(value, &s) != nil {
		return nil, fault
	}
	at, err := parseInstant(s, start)
	if err != nil {
		return nil, fault
	}
	return &clockSetting{at: at, running: name == "run_from"}, nil
}
