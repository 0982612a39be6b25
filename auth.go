// auth.go is who calls, and what the sandbox remembers of each caller. Who calls: accounts
// and their environments (tenants), loaded from a dataset or made at run time (sandboxes),
// and API keys with their scopes. What it remembers of each, all owned by the caller's
// tenant: the versions of its data and the one seam that writes the next; its sandbox clock
// and timeline; its rate limit (a key's); its rehearsals counted (Prefer times); its journal
// of requests and the findings judged from it; its stored answers (the answers of writes
// kept under their Idempotency-Keys); the registry that bounds what all tenants remember
// together and keeps the sandboxes; and the exams, an integration graded: their catalogue
// (each exam's task, checks and world, drawn for each attempt's variant) and an attempt (a
// sandbox made with the exam's rules, its answer and its grade). Its sections, each under a
// banner (grep '^// =====' *.go):
//
//   - Tenants: accounts and environments, one owner of what each holds
//   - The registry: the bounds every tenant shares, and the sandboxes it keeps
//   - Stored answers: a tenant's Idempotency-Keys, within the registry's bounds
//   - A bounded least-recently-used list
//   - Loading: records filed under their tenants
//   - Keys and scopes
//   - The rate limit
//   - Rehearsals counted: Prefer code=503; times=2
//   - The clock operations
//   - The journal
//   - The journal's reads
//   - The findings
//   - The journal as HAR
//   - The reads' queries
//   - What the page shows of a journal
//   - Sandboxes: accounts made at run time
//   - Exams: the catalogue
//   - Exams: an attempt, and its grade
//   - Exams: an attempt's trace, and its grade judged again
package main

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"
)

// ===== Tenants: accounts and environments, one owner of what each holds =====

// tenantID is an account and one of its environments: resources and keys belong to one.
type tenantID struct{ account, environment string }

func (id tenantID) String() string { return id.account + "/" + id.environment }

// tenant is one account's environment, and the one owner of all that lives and dies with
// it: the versions of its data, its sandbox clock, and what the sandbox remembers of its
// callers (its journal, its stored answers, its rehearsals counted, and the bytes these
// hold, which the registry's bounds count). Forgetting a sandbox's tenant drops it whole: once
// gone, nothing is written to it, and nothing can revive it.
//
// Lock order, everywhere: t.writing, then the registry's mu, then an exam attempt's mu (its
// grade, computed under it), then t.mu. Under t.mu nothing else is locked and nothing is
// waited for; the registry's mu is never taken under a t.mu, nor under an attempt's.
type tenant struct {
	id      tenantID
	live    bool
	start   time.Time                  // its start instant: relative instants (start+90s) are read against it
	data    atomic.Pointer[tenantData] // what it shows: a request reads it once
	writing sync.Mutex                 // the first lock: writes build the next version one at a time; reads never take it
	clock   sandboxClock
	faulted atomic.Uint64   // the requests -faults has judged, the k of the next is this plus one
	sandbox *sandboxAccount // nil for a tenant of the dataset; set before it is served
	rules   tenantRules     // what it is allowed, and how what it remembers is kept: set before it is served
	exam    *examAttempt    // the exam book's own: the attempt it was made for, read by that book alone; nil for any other

	// What the sandbox remembers of the tenant's callers, under mu, the last lock. Each
	// takes memory only as it fills.
	mu        sync.Mutex
	gone      atomic.Bool                      // forgotten: set under the registry's mu and mu, so either finds it
	journal   *journal                         // nil until a request is journaled
	answers   lru[string, idempotencyEntry]    // the answers stored under Idempotency-Keys
	sequences lru[[sha256.Size]byte, sequence] // Prefer: code=503; times=2, counted
	// What its journal and its stored answers hold, as the registry counts them: written under
	// mu, read without it when the registry looks for the largest.
	journalBytes, answerBytes atomic.Int64
}

// tenantRules is what a tenant is allowed, and how the sandbox keeps what it remembers of it:
// properties it is made with, read where they apply (the request path, the journal, the
// registry), as the rate limiter reads a key's limit. A dataset's tenant and a sandbox have
// the zero rules; an exam attempt is made with its exam's (Exams: an attempt, and its grade).
type tenantRules struct {
	name       string    // what it is found by besides its account ("" for none): an attempt's id
	maker      *apiKey   // the key that made it: a key holds at most maxHeldByMaker such tenants while they are held
	keepFirst  int       // its journal keeps its first keepFirst entries, whatever -journal, the later ones lost (and counted); 0: -journal's last entries
	clockFixed *apiError // its clock cannot be set, nor a request judged at an instant of its own: this refusal; nil: it can
	noFaults   bool      // -faults never fails its requests
	script     writeScript
	hold       holding // until when the bounds keep it first: not forgotten for idleness, its journal shed and it forgotten last; nil: like any sandbox
}

// writeScript is what answers a tenant's writes beyond their checks: of a creation of a
// shipment for an order that passed every check, what the script makes of it.
type writeScript interface{ booked() bookingScript }

// bookingScript is what a script makes of a creation of a shipment for an order.
type bookingScript uint8

const (
	bookingConfirmed bookingScript = iota // done and answered 201
	bookingDone                           // done, answered 502
	bookingNotDone                        // not done, answered 502
)

// holding is why the bounds keep a tenant first, and until when.
type holding interface {
	done() bool                                  // known to be over, without reading a clock
	doneAt(t *tenant, now time.Time) bool        // over at the wall clock's now
	left(t *tenant, now time.Time) time.Duration // how long after now it is over
}

// held reports whether the bounds keep t first at now.
func (t *tenant) held(now time.Time) bool { return t.rules.hold != nil && !t.rules.hold.doneAt(t, now) }

// heldYet reports, without reading a clock, whether the bounds may still keep t first.
func (t *tenant) heldYet() bool { return t.rules.hold != nil && !t.rules.hold.done() }

// newTenant is the tenant id, whose relative instants count from start, without data.
func newTenant(id tenantID, start time.Time) *tenant {
	t := &tenant{id: id, live: id.environment == "live", start: start}
	t.answers.max, t.sequences.max = maxStoredAnswers, maxSequences
	return t
}

// tenantData is what a tenant shows: its shipments, its orders and the timeline of what
// they schedule, built once (a dataset's tenant at start-up, a sandbox when it is made) and
// never edited in place. A write (a shipment created in a sandbox) builds the next version
// and swaps it in whole (tenant.writeNext), so a request reads one version, once, and all it
// answers is of that one. Writes add shipments and links, never an order: an order's place
// in the list is the same in every version.
type tenantData struct {
	shipments shipmentIndex
	orders    orderIndex
	timeline  []happening  // what is scheduled for its shipments and orders, in order
	writes    uint32       // the writes it holds: a journal entry keeps it, and the findings judge the entry against the data as it stood then
	links     []dataLink   // a sandbox's links, in the order they were made: a write builds its orders again with them
	source    *orderSource // where a sandbox's orders come from; nil for a dataset's tenant, which takes no write
	filed     *filedOrders // a sandbox's orders as its first write filed them, which every write builds again; nil before it
	adapter   bool         // it answers as the spec says the unreleased domain adapter will, where the two differ (a sandbox's profile domain_adapter)
}

// dataLink is a link a sandbox's data holds: the order, the shipment created with it, when
// the link shows (dawn: always), and the write that made it (0: the sandbox's records).
type dataLink struct {
	orderID, shipmentID string
	at                  instant
	write               uint32
}

// current is the tenant's data as it stands: one atomic load.
func (t *tenant) current() *tenantData { return t.data.Load() }

// bytes is about what the data holds on the heap, each part counted beside its fields: what
// the registry's bound of the sandboxes' bytes counts.
func (d *tenantData) bytes() int64 {
	n := d.orders.bytes() + d.shipments.bytes() + int64(len(d.timeline))*int64(unsafe.Sizeof(happening{})) +
		int64(len(d.links))*int64(unsafe.Sizeof(dataLink{})) + int64(unsafe.Sizeof(tenantData{}))
	if d.source != nil {
		n += d.source.bytes()
	}
	if d.filed != nil {
		n += d.filed.bytes()
	}
	return n
}

// writeNext builds the tenant's next version of its data from the one it holds with build, a
// pure function of that data, and swaps it in whole: one write of a tenant at a time, while
// reads take no lock and see the version before or the one after. The registry charges the
// version's bytes as it swaps it in; a sandbox forgotten meanwhile is not written
// (errForgotten), nor one that would hold more than every sandbox together may.
func (t *tenant) writeNext(b *tenantRegistry, build func(d *tenantData) (*tenantData, error)) (*tenantData, error) {
	t.writing.Lock()
	defer t.writing.Unlock()
	next, err := build(t.current())
	if err != nil {
		return nil, err
	}
	if err := b.swap(t, next); err != nil {
		return nil, err
	}
	return next, nil
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
	waits   bool // it stands at at until since, then runs from it (an exam attempt's, until its key's first request)
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

func (c *sandboxClock) read(wall func() time.Time) clockReading { return c.setting.Load().read(wall) }

// read is a clock set so (nil: following the wall clock) as it reads when the wall clock
// reads wall(); a frozen clock does not read the wall clock.
func (set *clockSetting) read(wall func() time.Time) clockReading {
	switch {
	case set == nil:
		return clockReading{now: wall()}
	case set.waits:
		w := wall()
		if w.Before(set.since) {
			return clockReading{now: set.at, frozen: true}
		}
		return clockReading{now: set.at.Add(w.Sub(set.since)), running: true, runningFrom: set.at}
	case set.running:
		return clockReading{now: set.at.Add(wall().Sub(set.since)), running: true, runningFrom: set.at}
	default:
		return clockReading{now: set.at, frozen: true}
	}
}

// begin starts a clock that stands until a first request (waits) at the wall clock's now:
// that request reads the instant it stands at. Any other clock is left as it is, and the
// wall clock is not read for it (a request reads it once).
func (c *sandboxClock) begin(wall func() time.Time) {
	set := c.setting.Load()
	if set == nil || !set.waits {
		return
	}
	if now := wall(); now.Before(set.since) {
		c.setting.CompareAndSwap(set, &clockSetting{at: set.at, running: true, since: now})
	}
}

// freeze stops the clock at at.
func (c *sandboxClock) freeze(at time.Time) { c.setting.Store(&clockSetting{at: at}) }

// timelineAround is the last n things the tenant's data schedules at or before at and
// the next n after it, oldest first, and how many more there are on each side: a search of
// the timeline, and counts by subtraction.
func (d *tenantData) timelineAround(at time.Time, n int) (past, future []happening, morePast, moreFuture int) {
	k := sort.Search(len(d.timeline), func(k int) bool { return d.timeline[k].at.After(at) })
	past, future = d.timeline[max(0, k-n):k], d.timeline[k:min(len(d.timeline), k+n)]
	return past, future, k - len(past), len(d.timeline) - k - len(future)
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
func (d *tenantData) timelineAt(at time.Time) ([]byte, error) {
	past, future, morePast, moreFuture := d.timelineAround(at, timelineSide)
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
func sortHappenings(h []happening) { slices.SortStableFunc(h, compareHappenings) }

func compareHappenings(a, b happening) int {
	if c := a.at.Compare(b.at); c != 0 {
		return c
	}
	if a.kind != b.kind {
		return int(a.kind) - int(b.kind)
	}
	return strings.Compare(a.id, b.id)
}

// withHappenings is the timeline tl, in order, with hs added: hs sorted, then merged, as
// sorting them appended to tl would place them, in a walk of tl rather than a sort of it.
func withHappenings(tl, hs []happening) []happening {
	sortHappenings(hs)
	merged := make([]happening, 0, len(tl)+len(hs))
	for len(tl) > 0 && len(hs) > 0 {
		if compareHappenings(hs[0], tl[0]) < 0 {
			merged, hs = append(merged, hs[0]), hs[1:]
		} else {
			merged, tl = append(merged, tl[0]), tl[1:]
		}
	}
	return append(append(merged, tl...), hs...)
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

// ===== The registry: the bounds every tenant shares, and the sandboxes it keeps =====

// tenantRegistry is what the tenants' bookkeeping shares: the bounds that hold for all of them
// together (the entries one journal keeps and the bytes all journals hold; the bytes of all
// stored answers; how many sandboxes are kept and the bytes of their data) and the
// sandboxes, tenants made at run time: by account, the most recently used first, and their
// keys by digest. A dataset's key is found before the registry is asked, so the registry costs a
// dataset's request nothing but its journal's entry.
//
// Its mu is the second lock of the order (t.writing, b.mu, t.mu). It is held to make,
// find, resize and forget a sandbox, and to make room under a bound, which takes the
// largest tenant's mu in turn; it is never taken under a tenant's mu. The byte counts are
// atomics, added to under a tenant's mu and read under b.mu.
type tenantRegistry struct {
	mu          sync.Mutex
	dataset     []*tenant             // the dataset's tenants: fixed
	sandboxes   lru[string, *tenant]  // weights: what each sandbox's data holds of its own
	keys        sync.Map              // [sha256.Size]byte -> *apiKey: the sandboxes' keys, found without the lock
	named       map[string]*tenant    // the sandboxes found by a name besides their account (an exam attempt's id)
	held        map[*apiKey][]*tenant // each key's tenants made by it that were held when it last made one: its bound's count
	shared      map[*sandboxTemplate]*sharedData
	sharedBytes int64 // what the shared data held by some copy holds, each counted once
	maxBytes    int64 // what the sandboxes' data may hold together
	idle        time.Duration

	journalLimit   int   // the entries a tenant's journal keeps (-journal); 0: none is kept
	maxJournal     int64 // what every journal may hold together
	examEntries    int   // the first entries an exam attempt's journal keeps: maxExamEntries (a test may lower it)
	journalTotal   atomic.Int64
	maxAnswerBytes int64 // what every tenant's stored answers may hold together
	answerTotal    atomic.Int64

	hooks registryHooks
}

// registryHooks let a test pause a step: where two steps, arranged so, once deadlocked (a claim
// of an Idempotency-Key holding its tenant's mu, a forget holding the registry's), and a write
// that holds its key in progress. Nil in the service.
type registryHooks struct {
	claiming   func(t *tenant)             // in claim, under t.mu
	claimed    func(t *tenant, key string) // once a write holds key in progress, under no lock
	forgetting func(t *tenant)             // in forget, under b.mu, before t.mu
}

// sharedData is the data of the copies of one template made at one start instant: read
// against the same instant, the same records make the same data, and data is never edited
// in place, so it is built once and held by each such copy (a test suite makes its copies
// in bursts). The registry counts its bytes once while any copy holds it.
type sharedData struct {
	template *sandboxTemplate
	start    time.Time
	data     *tenantData
	bytes    int64
	holders  int // under the registry's mu
}

func newTenantRegistry(dataset []*tenant, journalLimit int, journalBytes int64) *tenantRegistry {
	b := &tenantRegistry{dataset: dataset, shared: map[*sandboxTemplate]*sharedData{}, named: map[string]*tenant{}, held: map[*apiKey][]*tenant{}, maxBytes: maxSandboxBytes, idle: sandboxIdle,
		journalLimit: journalLimit, maxJournal: journalBytes, examEntries: maxExamEntries, maxAnswerBytes: maxStoredAnswerBytes}
	b.sandboxes.max = maxSandboxes
	return b
}

// journaling reports whether requests are journaled: -journal is not 0.
func (b *tenantRegistry) journaling() bool { return b.journalLimit > 0 }

// errSandboxBytes refuses a write that would take one sandbox's data past what every
// sandbox together may hold.
var errSandboxBytes = &apiError{code: codeCapabilityUnavailable, detail: fmt.Sprintf("With this shipment the sandbox's data would pass %d MiB, what all sandboxes hold together: make another sandbox, or send fewer events.", maxSandboxBytes>>20)}

// errForgotten answers a request whose sandbox was forgotten while it ran: its key is
// unknown from then on, so it is answered as an unknown key is, and writes nothing.
var errForgotten = &apiError{code: codeInvalidAPIKey, detail: "The API key is not valid: its sandbox was deleted or forgotten while this request ran, and nothing was written."}

// find is the sandbox key of this digest at the wall clock's now, or nil: a key of a sandbox
// idle for its time is forgotten with it. Finding a key counts as a use of its sandbox.
func (b *tenantRegistry) find(digest [sha256.Size]byte, now time.Time) *apiKey {
	v, ok := b.keys.Load(digest)
	if !ok {
		return nil
	}
	k := v.(*apiKey)
	t := k.tenant
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case t.gone.Load():
		return nil
	case b.idleLocked(t, now):
		b.forgetLocked(t)
		return nil
	}
	t.sandbox.lastUsed = now.UnixNano()
	b.sandboxes.get(t.id.account)
	return k
}

// idleLocked reports whether the sandbox t is idle for its time at now, and so forgotten:
// never while it is held. b.mu is held.
func (b *tenantRegistry) idleLocked(t *tenant, now time.Time) bool {
	return now.UnixNano()-t.sandbox.lastUsed >= int64(b.idle) && !t.held(now)
}

// add keeps the sandbox t, made for caller, with its keys, at now: the idle go first, then,
// past the bounds of count and bytes, the least recently used. Its own bytes are weight;
// what it shares, t.sandbox.shared counts. A sandbox whose caller's sandbox was forgotten
// while it was made is not kept (errForgotten).
func (b *tenantRegistry) add(t, caller *tenant, keys map[[sha256.Size]byte]*apiKey, weight int64, now time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if caller.gone.Load() {
		return errForgotten
	}
	if t.rules.maker != nil {
		if err := b.makerRoomLocked(t.rules.maker, now); err != nil {
			return err
		}
	}
	b.hold(t.sandbox.shared)
	for { // the idle go first (forgotten already to their keys, see find)
		_, oldest, ok := b.sandboxes.oldest()
		if !ok || !b.idleLocked(oldest, now) {
			break
		}
		b.forgetLocked(oldest)
	}
	t.sandbox.lastUsed = now.UnixNano()
	b.sandboxes.add(t.id.account, t, weight, true)
	b.makeRoomLocked()
	b.sandboxes.pin(t.id.account, false)
	for digest, k := range keys {
		t.sandbox.digests = append(t.sandbox.digests, digest)
		b.keys.Store(digest, k)
	}
	if t.rules.name != "" {
		b.named[t.rules.name] = t
	}
	if t.rules.maker != nil {
		b.held[t.rules.maker] = append(b.held[t.rules.maker], t)
	}
	return nil
}

// maxHeldByMaker is how many held tenants (exam attempts not yet graded) one key may have
// made: the next is 429, so that one key cannot fill the sandboxes' bound and forget other
// tenants'.
const maxHeldByMaker = 100

// makerRoomLocked refuses a tenant made by maker while it made maxHeldByMaker that are held at
// now: 429 with the whole seconds until its oldest such is no longer held. b.mu is held.
func (b *tenantRegistry) makerRoomLocked(maker *apiKey, now time.Time) error {
	held := slices.DeleteFunc(b.held[maker], func(t *tenant) bool { return t.gone.Load() || !t.held(now) }) // once over, a hold never comes back
	if len(held) == 0 {
		delete(b.held, maker)
	} else {
		b.held[maker] = held
	}
	if len(held) < maxHeldByMaker {
		return nil
	}
	oldest := held[0] // made in this order
	wait := oldest.rules.hold.left(oldest, now)
	return &apiError{code: codeRateLimited, retryAfter: max(1, int((wait+time.Second-1)/time.Second)), detail: fmt.Sprintf(
		"This key holds %d exam attempts not yet graded, the most one key may: start another once one is graded (answer it, or wait for its grading limit: Retry-After).", len(held))}
}

// makeRoomLocked forgets the least recently used sandboxes, but those pinned, while the
// count or the bytes are past their bounds: an exam attempt not yet graded last. b.mu is
// held.
func (b *tenantRegistry) makeRoomLocked() {
	for b.sandboxes.len() > b.sandboxes.max || b.sandboxes.weight+b.sharedBytes > b.maxBytes {
		_, oldest, ok := b.sandboxes.oldestWhere(func(t *tenant) bool { return !t.heldYet() })
		if !ok {
			if _, oldest, ok = b.sandboxes.oldest(); !ok {
				return
			}
		}
		b.forgetLocked(oldest)
	}
}

// sharedCopy is the data of the copy of tpl made last, when that copy started at start;
// else nil. add holds it for the new copy.
func (b *tenantRegistry) sharedCopy(tpl *sandboxTemplate, start time.Time) *sharedData {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sh := b.shared[tpl]; sh != nil && sh.start.Equal(start) {
		return sh
	}
	return nil
}

// hold counts one more holder of sh (nil: nothing shared), and its bytes once it has one,
// when it becomes the data that the next copies of its template at its start share. b.mu
// is held.
func (b *tenantRegistry) hold(sh *sharedData) {
	if sh == nil {
		return
	}
	if sh.holders == 0 {
		b.sharedBytes += sh.bytes
		b.shared[sh.template] = sh
	}
	sh.holders++
}

// release counts one holder of sh fewer: with none left, its bytes are no longer counted,
// and the next copy of its template builds its data anew. b.mu is held.
func (b *tenantRegistry) release(sh *sharedData) {
	if sh == nil {
		return
	}
	if sh.holders--; sh.holders == 0 {
		b.sharedBytes -= sh.bytes
		if b.shared[sh.template] == sh {
			delete(b.shared, sh.template)
		}
	}
}

// swap swaps next in as the sandbox t's data, counting its bytes, unless t was forgotten
// (errForgotten) or next alone would pass what every sandbox together may hold; past that
// bound, the least recently used others are forgotten.
func (b *tenantRegistry) swap(t *tenant, next *tenantData) error {
	bytes := next.bytes()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case t.gone.Load():
		return errForgotten
	case bytes > b.maxBytes:
		return errSandboxBytes
	}
	t.data.Store(next)
	b.sandboxes.replace(t.id.account, t, bytes, true)
	b.makeRoomLocked()
	b.sandboxes.pin(t.id.account, false)
	return nil
}

// forget forgets the sandbox of this account, and reports whether there was one.
func (b *tenantRegistry) forget(account string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.sandboxes.peek(account)
	if ok {
		b.forgetLocked(t)
	}
	return ok
}

// forgetLocked forgets the sandbox t whole: its keys are unknown from now on, the registry
// neither finds nor counts it, and the tenant lets go of all it remembers, so that what is
// still in flight with it writes and keeps nothing. b.mu is held.
func (b *tenantRegistry) forgetLocked(t *tenant) {
	if _, _, ok := b.sandboxes.remove(t.id.account); !ok {
		return // forgotten already
	}
	for _, digest := range t.sandbox.digests {
		if k, ok := b.keys.LoadAndDelete(digest); ok {
			delete(b.held, k.(*apiKey)) // a key forgotten makes no more
		}
	}
	if t.rules.name != "" {
		delete(b.named, t.rules.name)
	}
	b.release(t.sandbox.shared)
	if b.hooks.forgetting != nil {
		b.hooks.forgetting(t)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gone.Store(true)
	b.journalTotal.Add(-t.journalBytes.Swap(0))
	b.answerTotal.Add(-t.answerBytes.Swap(0))
	t.journal = nil
	t.answers.clear()
	t.sequences.clear()
}

// count is how many sandboxes are kept and not idle at now: what the page says.
func (b *tenantRegistry) count(now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	idle := 0
	for _, t := range b.sandboxes.olderFirst() {
		if !b.idleLocked(t, now) {
			break
		}
		idle++
	}
	return b.sandboxes.len() - idle
}

// largest is the tenant, of the dataset's and the sandboxes, of which weight counts the
// most, or nil when none counts anything. b.mu is held.
func (b *tenantRegistry) largest(weight func(t *tenant) int64) *tenant {
	var most *tenant
	var held int64
	consider := func(t *tenant) {
		if w := weight(t); w > held {
			most, held = t, w
		}
	}
	for _, t := range b.dataset {
		consider(t)
	}
	for _, t := range b.sandboxes.olderFirst() {
		consider(t)
	}
	return most
}

// ===== Stored answers: a tenant's Idempotency-Keys, within the registry's bounds =====

// The spec's writes each carry one stored, unique idempotency value (main.go's writes read
// the Idempotency-Key). What a tenant keeps under one, from its claim to its settling, and
// the bound of every tenant's stored answers together, which the registry keeps.

const (
	storedAnswerLife     = 24 * time.Hour
	maxStoredAnswers     = 10000    // a tenant's; beyond, the least recently used is forgotten
	maxStoredAnswerBytes = 64 << 20 // every tenant's together
)

// storedAnswer is the answer of a write that was done, as stored under its
// Idempotency-Key: never changed once made.
type storedAnswer struct {
	status      int
	contentType string
	location    string
	body        []byte
	shown       showing // what it showed, for the journal: the shipment a booking created
}

// idempotencyEntry is what a tenant keeps under an Idempotency-Key: the digest of the
// request that claimed it (its method, path and body; a repeat must be the same request),
// and, once its write is done, the write's answer and when it was stored; answer is nil
// while the write is in progress.
type idempotencyEntry struct {
	request [sha256.Size]byte
	answer  *storedAnswer
	stored  time.Time // by the wall clock: kept storedAnswerLife
}

// cost is what an answer stored under key holds, as the registry counts it.
func (a *storedAnswer) cost(key string) int64 {
	return int64(len(key)+len(a.body)+len(a.location)) + int64(unsafe.Sizeof(idempotencyEntry{})+unsafe.Sizeof(storedAnswer{})) + 96
}

// claim claims the Idempotency-Key key of t for a request at now: what is stored under it
// (found true; read under t's lock, and never changed after), or, when nothing is, the key
// held in progress for this request, pinned in t's list until settle. A tenant forgotten
// meanwhile has no keys (errForgotten).
func (b *tenantRegistry) claim(t *tenant, key string, request [sha256.Size]byte, now time.Time) (idempotencyEntry, bool, *apiError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.hooks.claiming != nil {
		b.hooks.claiming(t)
	}
	if t.gone.Load() {
		return idempotencyEntry{}, false, errForgotten
	}
	if e, ok := t.answers.get(key); ok {
		if e.answer == nil || now.Sub(e.stored) < storedAnswerLife {
			return e, true, nil
		}
		_, w, _ := t.answers.remove(key) // past its day: the key is new again
		b.unstore(t, w)
	}
	t.answers.add(key, idempotencyEntry{request: request}, 0, true)
	b.unstore(t, t.answers.trim())
	return idempotencyEntry{}, false, nil
}

// settle ends the write that claimed key of t: its answer is stored, when the write was
// done (written), else the key is free again. Past the bytes of every tenant's stored
// answers, the oldest of the tenant that holds the most go; a forgotten tenant keeps none.
func (b *tenantRegistry) settle(t *tenant, key string, written *storedAnswer, now time.Time) {
	t.mu.Lock()
	e, ok := t.answers.peek(key)
	if t.gone.Load() || !ok || e.answer != nil {
		t.mu.Unlock()
		return
	}
	over := false
	if written == nil {
		_, w, _ := t.answers.remove(key)
		b.unstore(t, w)
	} else {
		cost := written.cost(key)
		t.answers.replace(key, idempotencyEntry{e.request, written, now}, cost, false)
		t.answerBytes.Add(cost)
		over = b.answerTotal.Add(cost) > b.maxAnswerBytes
	}
	b.unstore(t, t.answers.trim()) // back within its count, once its entries in progress end
	t.mu.Unlock()
	if over {
		b.makeAnswerRoom()
	}
}

// unstore takes what t's stored answers no longer hold off the counts; t.mu is held.
func (b *tenantRegistry) unstore(t *tenant, freed int64) {
	t.answerBytes.Add(-freed)
	b.answerTotal.Add(-freed)
}

// makeAnswerRoom forgets the oldest stored answers of the tenant that holds the most until
// every tenant's together are within the bound (entries in progress hold nothing).
func (b *tenantRegistry) makeAnswerRoom() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.answerTotal.Load() > b.maxAnswerBytes {
		t := b.largest(func(t *tenant) int64 { return t.answerBytes.Load() })
		if t == nil {
			return
		}
		t.mu.Lock()
		freed := t.answers.shed(b.answerTotal.Load() - b.maxAnswerBytes)
		b.unstore(t, freed)
		t.mu.Unlock()
		if freed == 0 {
			return
		}
	}
}

// ===== A bounded least-recently-used list =====

// lru is a list of values by key, the most recently used first, bounded by a count: trim
// forgets the least recently used past max. It sums its entries' weights (their bytes) for
// a bound its owner keeps with others. An entry pinned (a write in progress, a sandbox
// being written) is never what it forgets: past max when every entry is pinned, it holds
// them all, and trim brings it back once they are unpinned. It takes memory only as it
// fills; its owner's lock guards it. The sandboxes, each tenant's stored answers and each
// tenant's rehearsals counted are kept in one.
type lru[K comparable, V any] struct {
	byKey  map[K]*lruEntry[K, V]
	root   *lruEntry[K, V] // root.next is the most recently used, root.prev the least; nil until the first entry
	max    int
	weight int64 // its entries' weights together
}

type lruEntry[K comparable, V any] struct {
	key        K
	value      V
	weight     int64
	pinned     bool
	prev, next *lruEntry[K, V]
}

// add keeps value under key, which it does not hold, as the most recently used.
func (l *lru[K, V]) add(key K, value V, weight int64, pinned bool) {
	if l.byKey == nil {
		l.byKey, l.root = map[K]*lruEntry[K, V]{}, &lruEntry[K, V]{}
		l.root.next, l.root.prev = l.root, l.root
	}
	e := &lruEntry[K, V]{key: key, value: value, weight: weight, pinned: pinned}
	l.byKey[key] = e
	l.linkFront(e)
	l.weight += weight
}

// get is the value under key, which is then the most recently used.
func (l *lru[K, V]) get(key K) (V, bool) {
	e := l.byKey[key]
	if e == nil {
		var zero V
		return zero, false
	}
	l.unlink(e)
	l.linkFront(e)
	return e.value, true
}

// peek is the value under key, its use left as it was.
func (l *lru[K, V]) peek(key K) (V, bool) {
	if e := l.byKey[key]; e != nil {
		return e.value, true
	}
	var zero V
	return zero, false
}

// replace replaces the value and weight under key, which it holds, and pins or unpins it.
func (l *lru[K, V]) replace(key K, value V, weight int64, pinned bool) {
	e := l.byKey[key]
	l.weight += weight - e.weight
	e.value, e.weight, e.pinned = value, weight, pinned
}

// pin pins or unpins the entry under key, if it holds one.
func (l *lru[K, V]) pin(key K, pinned bool) {
	if e := l.byKey[key]; e != nil {
		e.pinned = pinned
	}
}

// remove forgets the entry under key, and returns its value and weight.
func (l *lru[K, V]) remove(key K) (V, int64, bool) {
	e := l.byKey[key]
	if e == nil {
		var zero V
		return zero, 0, false
	}
	delete(l.byKey, key)
	l.unlink(e)
	l.weight -= e.weight
	return e.value, e.weight, true
}

// oldest is the least recently used entry that is not pinned.
func (l *lru[K, V]) oldest() (K, V, bool) {
	return l.oldestWhere(func(V) bool { return true })
}

// oldestWhere is the least recently used entry that is not pinned and whose value first
// lets go of before the others (a sandbox before an exam attempt not yet graded).
func (l *lru[K, V]) oldestWhere(first func(V) bool) (K, V, bool) {
	if l.byKey != nil {
		for e := l.root.prev; e != l.root; e = e.prev {
			if !e.pinned && first(e.value) {
				return e.key, e.value, true
			}
		}
	}
	var key K
	var zero V
	return key, zero, false
}

// trim forgets the least recently used entries not pinned while more than max are held,
// and returns the weight it forgot.
func (l *lru[K, V]) trim() int64 {
	return l.forgetOldest(func(int64) bool { return len(l.byKey) > l.max })
}

// shed forgets the least recently used entries not pinned until want of weight is
// forgotten or none is left to forget, and returns the weight it forgot.
func (l *lru[K, V]) shed(want int64) int64 {
	return l.forgetOldest(func(forgot int64) bool { return forgot < want })
}

// forgetOldest forgets the least recently used entry not pinned while more says so of the
// weight forgotten so far, and returns that weight.
func (l *lru[K, V]) forgetOldest(more func(forgot int64) bool) int64 {
	var forgot int64
	for more(forgot) {
		key, _, ok := l.oldest()
		if !ok {
			break
		}
		_, w, _ := l.remove(key)
		forgot += w
	}
	return forgot
}

// clear forgets every entry, and the memory the list took.
func (l *lru[K, V]) clear() { *l = lru[K, V]{max: l.max} }

func (l *lru[K, V]) len() int { return len(l.byKey) }

// olderFirst yields its entries, the least recently used first.
func (l *lru[K, V]) olderFirst() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if l.byKey == nil {
			return
		}
		for e := l.root.prev; e != l.root; e = e.prev {
			if !yield(e.key, e.value) {
				return
			}
		}
	}
}

func (l *lru[K, V]) linkFront(e *lruEntry[K, V]) {
	e.prev, e.next = l.root, l.root.next
	l.root.next.prev = e
	l.root.next = e
}

func (l *lru[K, V]) unlink(e *lruEntry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// ===== Loading: records filed under their tenants =====

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
		ld.addTenant(id)
	}
	return nil
}

// addTenant declares the tenant id, whose relative instants count from the loader's start.
func (ld *loader) addTenant(id tenantID) *tenant {
	t := newTenant(id, ld.start)
	t.data.Store(&tenantData{shipments: newShipmentIndex(id.String(), ld.start), orders: newOrderIndex(id.account, id.environment, ld.start)})
	ld.tenants.byID[id] = t
	ld.tenants.list = append(ld.tenants.list, t)
	return t
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

func (rec keyRecord) owner() (string, string)      { return rec.Account, rec.Environment }
func (rec shipmentRecord) owner() (string, string) { return rec.Account, rec.Environment }

// eachRecord finds the tenant each record of the dataset's list name belongs to (into, when
// given: a sandbox's records name none), and hands both to add.
func eachRecord[T record](ts *tenants, into *tenant, name string, list []T, add func(path string, rec T, t *tenant) error) error {
	for i, rec := range list {
		path := "$." + name + "[" + strconv.Itoa(i) + "]"
		t := into
		if t == nil {
			var err error
			account, environment := rec.owner()
			if t, err = ts.find(path, account, environment); err != nil {
				return err
			}
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
	return eachRecord(&ld.tenants, nil, "keys", list, func(path string, rec keyRecord, t *tenant) error {
		line, err := ld.addKey(path, rec, t)
		ld.keyLines = append(ld.keyLines, line)
		return err
	})
}

// loadOrders hands each of the dataset's orders to its tenant's orders (into's, when given:
// a sandbox's records name none). Orders mostly come in runs of one tenant's, so the tenant
// of the order before is tried first. The records are only read: a template's are loaded
// by every sandbox made from it.
func (ld *loader) loadOrders(rs *orderRecords, into *tenant) error {
	t := into
	for i := range rs.list {
		path := "$.orders[" + strconv.Itoa(i) + "]"
		account, environment := rs.values[rs.list[i].account], rs.values[rs.list[i].environment]
		if into == nil && (t == nil || t.id != (tenantID{account, environment})) {
			var err error
			if t, err = ld.tenants.find(path, account, environment); err != nil {
				return err
			}
		}
		ix := &t.current().orders // built in place: nothing reads it before it is served
		ix.recs = rs
		if err := ix.addOrder(path, rs, i); err != nil {
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
func (ld *loader) loadShipments(list []shipmentRecord, into *tenant) ([]loadedShipment, error) {
	var noted []loadedShipment
	err := eachRecord(&ld.tenants, into, "shipments", list, func(path string, rec shipmentRecord, t *tenant) error {
		d := t.current()
		s, n, err := d.shipments.addShipment(path, rec)
		if err != nil {
			return err
		}
		if n.dropped > 0 || n.duplicates > 0 {
			noted = append(noted, loadedShipment{rec.ID, t.id, n})
		}
		if rec.OrderID == nil {
			return nil
		}
		if !d.orders.has(*rec.OrderID) {
			// Only a refusal asks the other tenants, to name the order's owner: loading
			// stays linear in the number of tenants.
			for _, other := range ld.tenants.list {
				if other.current().orders.has(*rec.OrderID) {
					return &datasetError{path: path + ".order_id", reason: fmt.Sprintf("order %q belongs to %s, not to %s: shipment %q cannot be linked across accounts or environments", *rec.OrderID, other.id, t.id, rec.ID)}
				}
			}
		}
		if into != nil { // a sandbox's: a write builds its orders again with them
			d.links = append(d.links, dataLink{*rec.OrderID, rec.ID, s.createdAt, 0})
		}
		return d.orders.link(path, *rec.OrderID, rec.ID, s.createdAt, 0)
	})
	return noted, err
}

// build prepares each tenant's indexes once every record is filed, and counts what they hold.
func (ld *loader) build() (orders, shipments int, err error) {
	for _, t := range ld.tenants.list {
		d := t.current()
		d.shipments.build()
		if err := d.orders.build(); err != nil {
			return 0, 0, err
		}
		d.timeline = append(d.shipments.happenings, d.orders.happenings...)
		d.shipments.happenings, d.orders.happenings = nil, nil
		sortHappenings(d.timeline)
		orders += d.orders.count()
		shipments += d.shipments.count()
	}
	return orders, shipments, nil
}

// ===== Keys and scopes =====

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
	mask      string  // how the journal names it: never the key
	scopes    scope
	expiresAt instant // never, when the key has no expiry
	revoked   bool
	bucket    bucket     // the key's rate-limit state
	limit     *rateLimit // its own limit, whatever -rate (an exam attempt's key); nil: the sandbox's
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
	k := &apiKey{tenant: t, mask: keyMask(rec.Key), revoked: rec.Revoked, expiresAt: never}
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

// keyFinder finds the key a request carries: a dataset's, by its digest in the dataset's
// keyring, else a sandbox's, in the registry.
type keyFinder struct {
	dataset   keyring
	sandboxes *tenantRegistry
	wall      func() time.Time
}

// authenticate finds the key a request carries, unless it is unknown or revoked; its
// expiry is judged by the caller, at the instant the caller reads.
func (kf *keyFinder) authenticate(h http.Header) (*apiKey, *apiError) {
	token, fault := bearerToken(h)
	if fault != nil {
		return nil, fault
	}
	digest := sha256.Sum256([]byte(token))
	k := kf.dataset[digest]
	if k == nil && kf.sandboxes != nil {
		k = kf.sandboxes.find(digest, kf.wall())
	}
	switch {
	case k == nil:
		return nil, errUnknownKey
	case k.revoked:
		return k, errRevokedKey
	}
	return k, nil
}

// known reports whether text is a key of the dataset or of a sandbox, whatever its state, by
// its digest: the log never writes one, wherever a client put it. It counts as no use of a
// sandbox.
func (kf *keyFinder) known(text string) bool {
	digest := sha256.Sum256([]byte(text))
	if kf.dataset[digest] != nil {
		return true
	}
	_, ok := kf.sandboxes.keys.Load(digest)
	return ok
}

// expiredAt reports whether the key has expired at at: at and after its expires_at.
func (k *apiKey) expiredAt(at time.Time) bool {
	return !k.expiresAt.after(instantOf(at))
}

// ===== The rate limit =====

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

// ===== Rehearsals counted: Prefer code=503; times=2 =====

// Rehearsals counted: a code that fails only the first N requests of a sequence (Prefer:
// code=503; times=2). The requests of one sequence share the tenant, the method, the
// target as sent and the whole Prefer value.

const (
	sequenceIdle = 60 * time.Second // a sequence is forgotten this long after its last request
	maxSequences = 10000            // a tenant's; a new one beyond forgets the least recently used
)

// sequence is what a tenant keeps of one sequence, by the SHA-256 digest of its identity
// (in its list of at most maxSequences, the most recently used first).
type sequence struct {
	count int
	last  time.Time
}

// countRequest counts a request of the sequence id at now and returns how many it has had,
// this one included: 1 for a sequence that is new, or forgotten sequenceIdle after its
// last. A forgotten tenant keeps nothing.
func (t *tenant) countRequest(id [sha256.Size]byte, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	seq, held := t.sequences.get(id)
	if held && now.Sub(seq.last) >= sequenceIdle {
		seq.count = 0
	}
	seq.count, seq.last = seq.count+1, now
	switch {
	case t.gone.Load():
	case held:
		t.sequences.replace(id, seq, 0, false)
	default:
		t.sequences.add(id, seq, 0, false)
		t.sequences.trim()
	}
	return seq.count
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

// ===== The clock operations =====

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
	wall func() time.Time
}

// get answers GET /v1/test_helpers/clock: the tenant's clock as the request read it.
func (h clockHelpers) get(w http.ResponseWriter, t *tenant, clock clockReading) error {
	return h.answer(w, t, clock)
}

// set answers POST /v1/test_helpers/clock: it freezes the tenant's clock at the body's
// frozen_time, lets it follow the wall clock again (null), or sets it running from
// run_from, and answers the clock it set. A body that is refused changes nothing.
func (h clockHelpers) set(w http.ResponseWriter, b []byte, t *tenant) error {
	set, err := parseClockBody(b, t.start)
	if err != nil {
		return err
	}
	now := h.wall()
	if set != nil && set.running {
		set.since = now
	}
	t.clock.setting.Store(set)
	return h.answer(w, t, set.read(func() time.Time { return now })) // as set, not as read again
}

// answer answers with one reading of a tenant's clock: frozen_time and now always agree.
func (h clockHelpers) answer(w http.ResponseWriter, t *tenant, clock clockReading) error {
	a := clockAnswer{Now: formatTimestamp(clock.now), StartedAt: formatTimestamp(t.start)}
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
	if !oneJSONObject(b) {
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

// ===== The journal =====

// The journal: each test tenant's last requests, kept as the contract writes them (never a
// key), and the findings: what they tell of the integration that made them. The sandbox
// set every trap an integration can fall into, so it can say whether the client fell in.

const (
	defaultJournal   = 1000      // -journal: the entries a tenant keeps
	maxJournal       = 100000    // the most -journal may ask for
	maxJournalBytes  = 256 << 20 // every journal together
	maxJournalTarget = 1024      // an entry's target is cut past this, as log values are
	maxJournalPrefer = 256       // and its Prefer past this
	maxJournalRead   = 1000      // the most entries one read of the journal answers
)

// journalEntry is one journaled request. What its answer showed is kept as positions in
// the tenant's indexes (shown): with the dataset and the entry's instant, which never
// change, they give its ids exactly, at a fraction of their bytes.
type journalEntry struct {
	seq         uint64
	arrived     int64   // the wall instant it arrived, in ns since 1970
	duration    int64   // ns from its arrival until its answer's headers were written
	clock       instant // the instant its resources were judged at
	writes      uint32  // the writes the data it read held: the version it is judged against
	key         *apiKey // the key it named (shown masked, never itself)
	method      string
	routePath   string // the matched pattern's path
	target      string // its path and query as sent, cut at maxJournalTarget
	prefer      string // its Prefer fields as sent, joined and cut at maxJournalPrefer
	runTag      string // its Prefer run
	requestID   string
	code        code   // the problem's, "" for none
	contentType string // the answer's, "" for none
	size        int64  // the answer's Content-Length, -1 when it sent none
	retryAfter  int32  // the Retry-After seconds it sent, -1 for none
	status      int16
	simulated   simulation
	hasPrefer   bool
	shown       showing
	// A write's Idempotency-Key fields as sent, joined and cut as prefer is, and the bytes
	// of any request's body (-1 when not known).
	idempotencyKey    string
	hasIdempotencyKey bool
	bodySize          int64
	write             *writeMark // a write's, once its body was read; nil for any other request
	// A 429 of an exam attempt's key's own limit: journaled once a second of the wall clock
	// (the server's, as its limiter reads it: limited is that second since 1970, 0 for any
	// other entry) for its key, method and target, the later ones counted in repeats.
	limited int64
	repeats int32
	traced  *tracedParts // an exam attempt's entry: what its trace shows beyond the journal's members; nil for none
}

// tracedParts is what an exam attempt's journal keeps of an entry for its trace (GET
// /v1/test_helpers/exams/{id}/trace), beyond what every journal keeps: the body its request
// read and its Content-Type (lost past the attempt's maxTracedBodies), the answer's text as sent
// where it is no read (a read's is rendered again from the world), the id a write made, and
// whether its target was cut.
type tracedParts struct {
	contentType string
	body        []byte
	bodyLost    bool
	text        []byte
	made        string // "shp_..." or "acct_...": the id its write made (a 201, or the 502 of a write done); "" for none
	targetCut   bool
}

// maxTracedBodies is what the bodies an attempt's journal keeps for its trace hold together.
const maxTracedBodies = 16 << 20

// writeMark is what blind_retry compares of a write: its Idempotency-Key as read (no
// quotes) and its body's digest (the journal keeps no body).
type writeMark struct {
	key     string
	body    [sha256.Size]byte
	orderID string // a booking's order_id (POST /v1/test_helpers/shipments): blind_retry judges a booking by its order
}

// entrySlot is what one entry takes in a ring, and journalHeader what a journal takes
// before its first entry: the registry counts both.
const (
	entrySlot     = int64(unsafe.Sizeof(journalEntry{}))
	journalHeader = int64(unsafe.Sizeof(journal{})) + 8 // and the tenant's pointer to it
)

// cost is what an entry holds beyond its slot: the strings it keeps, counted whole (an
// uncut target keeps the request line it was cut from, its method and protocol within the
// 16 added; the method itself is a constant, see ownMethod).
func (e *journalEntry) cost() int64 {
	n := int64(len(e.method)+len(e.target)+len(e.prefer)+len(e.runTag)+len(e.requestID)+len(e.idempotencyKey)) + 16
	if e.write != nil {
		n += int64(unsafe.Sizeof(writeMark{})) + int64(len(e.write.orderID)) // its key is the field's, as sent
	}
	if p := e.traced; p != nil {
		n += int64(unsafe.Sizeof(tracedParts{})) + int64(len(p.contentType)+len(p.body)+len(p.text)+len(p.made))
	}
	return n
}

// durationMS is the entry's duration in milliseconds, to the microsecond.
func (e *journalEntry) durationMS() float64 { return math.Round(float64(e.duration)/1e3) / 1e3 }

// showing is what an answer showed, as positions: of a 200 of the four operations, a
// retrieved order's, a tracking view's shipment, or a page (its filter, first position and
// last order); of a booking's 201 (or the 502 that answered instead), the shipment it
// created. A 404 by a tracking number several shipments held keeps the first of them.
type showing struct {
	kind  showingKind
	order int32
	ship  *shipment
	page  listedPage
}

type showingKind uint8

const (
	showsNothing showingKind = iota
	showsOrder
	showsShipment
	showsPage
	showsSharedNumber // a 404 by a tracking number held by several shipments then
	showsParcelNumber // a 404 by a further parcel's number (order: its place among the shipment's parcels)
	showsWritten      // a shipment a write created or moved (its 201, or the 502 that answered instead)
)

// read reports whether the entry is a 200 GET of the four operations: the entries read as
// having shown something.
func (e *journalEntry) read() bool {
	return e.status == http.StatusOK && e.method == http.MethodGet && e.shown.kind >= showsOrder && e.shown.kind <= showsPage
}

// journal is a tenant's journal, under the tenant's mu: its last entries in a ring that
// grows as they come (never allocated ahead of them) up to the registry's limit, then wraps,
// the oldest going first. Its entries' seqs are consecutive: those before the oldest held
// were dropped.
type journal struct {
	ring     []journalEntry
	lost     uint64        // an exam attempt's entries not kept: past its first maxExamEntries, or dropped for bytes
	oldest   int           // where the oldest held entry is in ring
	n        int           // how many are held
	last     uint64        // the newest entry's seq; 0 before the first
	counted  findingsCount // the page's count of findings, as of an entry
	counting chan struct{} // closed when the count running aside ends; nil when none runs
	// Where the 429s of an attempt's key's own limit of the last two seconds are held, by
	// what merges them (nil until the first).
	limitedSeqs   map[limitedKey]uint64
	limitedSecond int64
	bodies        int64 // the bytes of the bodies its entries keep for an attempt's trace (at most maxTracedBodies)
}

// findingsCount is how many findings a journal's entries held when its newest was seq, and
// the first of them, written, for the page.
type findingsCount struct {
	seq   uint64
	n     int
	first []finding
}

// keepEntry journals e in t's journal, numbering it, within the registry's bounds: past the
// entries a journal keeps, its oldest goes; past the bytes of all journals, the oldest
// entries of the largest. An exam attempt's journal keeps its first maxExamEntries, whatever
// -journal, the later ones lost (and counted), and a 429 of its key's own limit once per
// method, target and second, the later ones of that second counted in its repeats. A tenant
// forgotten meanwhile keeps nothing.
func (b *tenantRegistry) keepEntry(t *tenant, e *journalEntry) {
	cost, limit := e.cost(), b.journalLimit
	if t.rules.keepFirst > 0 {
		limit = t.rules.keepFirst
	}
	for {
		t.mu.Lock()
		if t.gone.Load() || t.journal.repeated(e) {
			t.mu.Unlock()
			return
		}
		cost -= t.journal.bodyKept(e)
		j, need := t.journal, cost
		switch {
		case j == nil: // its first entry opens it
			need += journalHeader + entrySlot
		case j.n == limit && t.rules.keepFirst > 0: // its first entries are the ones kept; a later one is never numbered
			j.lost++
			t.mu.Unlock()
			return
		case j.n == limit: // the oldest goes
			need -= j.ring[j.oldest].cost()
		case j.n == len(j.ring):
			need += int64(j.grown(limit)-len(j.ring)) * entrySlot
		}
		if b.journalTotal.Add(need) <= b.maxJournal || need <= 0 {
			if j == nil {
				j = &journal{}
				t.journal = j
			}
			j.push(e, limit)
			j.noteLimited(e)
			if e.traced != nil {
				j.bodies += int64(len(e.traced.body))
			}
			t.journalBytes.Add(need)
			t.mu.Unlock()
			return
		}
		b.journalTotal.Add(-need)
		t.mu.Unlock()
		if !b.makeJournalRoom(need) { // nothing held anywhere, and still no room: e is dropped
			t.mu.Lock()
			if t.journal != nil {
				t.journal.last++
				if t.rules.keepFirst > 0 {
					t.journal.lost++
				}
			}
			t.mu.Unlock()
			return
		}
	}
}

// bodyKept drops the body e keeps for an attempt's trace when it would take the attempt's
// bodies past maxTracedBodies (its trace says it is lost), and returns the bytes dropped. j
// is under its tenant's mu; nil holds none.
func (j *journal) bodyKept(e *journalEntry) int64 {
	p := e.traced
	if j == nil || p == nil || p.body == nil || j.bodies+int64(len(p.body)) <= maxTracedBodies {
		return 0
	}
	n := int64(len(p.body))
	p.body, p.bodyLost = nil, true
	return n
}

// repeated counts e in the entry of the same key, method and target that the same second
// of the wall clock journaled, when e is a 429 of an attempt's key's own limit: such an
// entry is kept once a second. j is under its tenant's mu; nil holds none.
func (j *journal) repeated(e *journalEntry) bool {
	if j == nil || e.limited == 0 {
		return false
	}
	seq, ok := j.limitedSeqs[limitedOf(e)]
	if first := j.last - uint64(j.n) + 1; !ok || seq < first {
		return false
	}
	j.ring[(j.oldest+int(seq-(j.last-uint64(j.n)+1)))%len(j.ring)].repeats++
	return true
}

// limitedKey is what a 429 of an attempt's key's own limit is merged by: its second of the
// wall clock, its key, method and target.
type limitedKey struct {
	second         int64
	key            *apiKey
	method, target string
}

func limitedOf(e *journalEntry) limitedKey { return limitedKey{e.limited, e.key, e.method, e.target} }

// noteLimited remembers where e, a 429 of an attempt's key's own limit just pushed, is held,
// so that the later ones of its second are merged into it whatever the number of targets;
// the seconds before the one before e's are forgotten. j is under its tenant's mu.
func (j *journal) noteLimited(e *journalEntry) {
	if e.limited == 0 {
		return
	}
	if j.limitedSeqs == nil {
		j.limitedSeqs = map[limitedKey]uint64{}
	}
	if e.limited > j.limitedSecond {
		j.limitedSecond = e.limited
		for k := range j.limitedSeqs {
			if k.second < e.limited-1 {
				delete(j.limitedSeqs, k)
			}
		}
	}
	j.limitedSeqs[limitedOf(e)] = e.seq
}

// journalLost is how many entries t's journal did not keep (an exam attempt's, past its
// first maxExamEntries or dropped to keep every journal within its bytes).
func (t *tenant) journalLost() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.journal == nil {
		return 0
	}
	return t.journal.lost
}

// makeJournalRoom drops the oldest entries of the largest journals until need more bytes
// fit under the bound of all journals. It reports false when no journal holds an entry to
// drop.
func (b *tenantRegistry) makeJournalRoom(need int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.journalTotal.Load()+need > b.maxJournal {
		t := b.largest(func(t *tenant) int64 { // a tenant held is shed last
			if t.heldYet() {
				return 0
			}
			return t.journalBytes.Load()
		})
		if t == nil {
			t = b.heaviestMakersHeld()
		}
		if t == nil {
			return false
		}
		t.mu.Lock()
		freed := int64(0)
		if j := t.journal; j != nil {
			held := j.n
			freed = j.shed(b.journalTotal.Load()+need-b.maxJournal, t.journalBytes.Load())
			if t.rules.keepFirst > 0 {
				j.lost += uint64(held - j.n)
			}
		}
		t.journalBytes.Add(-freed)
		b.journalTotal.Add(-freed)
		t.mu.Unlock()
		if freed == 0 {
			return false
		}
	}
	return true
}

// heaviestMakersHeld is, among the tenants held, the largest journal of the key whose
// tenants hold the most entries: another key's attempts never shed a running attempt's
// evidence. nil when none holds any. b.mu is held.
func (b *tenantRegistry) heaviestMakersHeld() *tenant {
	held := map[*apiKey]int64{}
	for maker, ts := range b.held {
		for _, t := range ts {
			held[maker] += t.journalBytes.Load()
		}
	}
	var maker *apiKey
	for k, n := range held {
		if n > 0 && (maker == nil || n > held[maker]) {
			maker = k
		}
	}
	var most *tenant
	for _, t := range b.held[maker] {
		if most == nil || t.journalBytes.Load() > most.journalBytes.Load() {
			most = t
		}
	}
	if most == nil || most.journalBytes.Load() == 0 {
		return nil
	}
	return most
}

// grown is the ring's length once it grows: twice as long, up to limit.
func (j *journal) grown(limit int) int { return min(limit, max(1, 2*len(j.ring))) }

// push adds e as the newest entry, the oldest going when limit are held.
func (j *journal) push(e *journalEntry, limit int) {
	j.last++
	e.seq = j.last
	if j.n == limit {
		j.ring[j.oldest] = *e
		j.oldest = (j.oldest + 1) % len(j.ring)
		return
	}
	if j.n == len(j.ring) {
		j.refit(j.grown(limit))
	}
	j.ring[(j.oldest+j.n)%len(j.ring)] = *e
	j.n++
}

// refit moves the held entries to a ring of n, oldest first.
func (j *journal) refit(n int) {
	ring := make([]journalEntry, n)
	for k := range j.n {
		ring[k] = j.ring[(j.oldest+k)%len(j.ring)]
	}
	j.ring, j.oldest = ring, 0
}

// shed drops the oldest entries until want bytes are freed, or a quarter of what the
// journal holds, held (so that room is not made one entry at a time), and fits its ring to what
// is left. It returns the bytes freed.
func (j *journal) shed(want, held int64) int64 {
	want = max(want, held/4)
	var freed int64
	dropped := 0
	for dropped < j.n && freed < want {
		freed += j.ring[(j.oldest+dropped)%len(j.ring)].cost() + entrySlot
		dropped++
	}
	freed += int64(len(j.ring)-j.n) * entrySlot // the ring's empty slots go too
	j.oldest, j.n = (j.oldest+dropped)%max(1, len(j.ring)), j.n-dropped
	j.refit(j.n)
	return freed
}

// journalRead is what a read of the journal takes: the entries after a seq, of a run if
// one is given, at most limit (0: every one).
type journalRead struct {
	after  uint64
	runTag string
	limit  int
}

// journalPart is what a read finds: its entries, oldest first, whether more follow, the
// journal's newest seq, and how many entries after the read's seq were dropped.
type journalPart struct {
	entries       []journalEntry
	more          bool
	last, dropped uint64
}

// journalPart copies the entries q asks for out of t's journal.
func (t *tenant) journalPart(q journalRead) journalPart {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.journal
	if j == nil {
		return journalPart{}
	}
	part := journalPart{last: j.last}
	if first := j.last - uint64(j.n); first > q.after { // seqs up to first were dropped
		part.dropped = first - q.after
	}
	room := j.n
	if q.limit > 0 {
		room = min(room, q.limit)
	}
	part.entries = make([]journalEntry, 0, room)
	for k := range j.n {
		e := &j.ring[(j.oldest+k)%len(j.ring)]
		if e.seq <= q.after || q.runTag != "" && e.runTag != q.runTag {
			continue
		}
		if q.limit > 0 && len(part.entries) == q.limit {
			part.more = true
			break
		}
		part.entries = append(part.entries, *e)
	}
	return part
}

// keyMask is how the journal names a key: "..." and its last 4 characters, after its
// first 8 when it has 24 or more; "..." alone under 8.
func keyMask(key string) string {
	switch {
	case len(key) < 8:
		return "..."
	case len(key) < 24:
		return "..." + key[len(key)-4:]
	}
	return key[:8] + "..." + key[len(key)-4:]
}

// ===== The journal's reads =====

// The journal's reads: GET /v1/test_helpers/requests and /findings.

// entryJSON is an entry as the journal's read writes it, its members in this order.
type entryJSON struct {
	Seq            uint64   `json:"seq"`
	At             string   `json:"at"`
	Clock          string   `json:"clock"`
	Method         string   `json:"method"`
	Route          string   `json:"route"`
	Target         string   `json:"target"`
	Key            string   `json:"key"`
	Status         int      `json:"status"`
	Code           *string  `json:"code"`
	Simulated      *string  `json:"simulated"`
	RequestID      string   `json:"request_id"`
	DurationMS     float64  `json:"duration_ms"`
	Prefer         *string  `json:"prefer"`
	RetryAfter     *int     `json:"retry_after"`
	IDs            []string `json:"ids"`
	IdempotencyKey *string  `json:"idempotency_key"`
	Repeats        *int32   `json:"repeats,omitempty"` // an exam attempt's 429 of its key's own limit: the later ones of its second
}

// requestsAnswer is GET /v1/test_helpers/requests's answer.
type requestsAnswer struct {
	Data    []entryJSON `json:"data"`
	HasMore bool        `json:"has_more"`
	LastSeq uint64      `json:"last_seq"`
	Dropped uint64      `json:"dropped"`
}

// entryJSONOf is e as the journal's read writes it; its ids are those its answer showed.
func (d *tenantData) entryJSONOf(e *journalEntry) entryJSON {
	j := entryJSON{Seq: e.seq, At: formatTimestamp(time.Unix(0, e.arrived)), Clock: formatInstant(e.clock), Method: e.method,
		Route: e.routePath, Target: e.target, Key: e.key.mask, Status: int(e.status), RequestID: e.requestID,
		DurationMS: e.durationMS(), IDs: d.idsOf(e)}
	if e.code != "" {
		c := string(e.code)
		j.Code = &c
	}
	if s := e.simulated.String(); s != "" {
		j.Simulated = &s
	}
	if e.hasPrefer {
		j.Prefer = &e.prefer
	}
	if e.retryAfter >= 0 {
		ra := int(e.retryAfter)
		j.RetryAfter = &ra
	}
	if e.hasIdempotencyKey {
		j.IdempotencyKey = &e.idempotencyKey
	}
	if e.limited != 0 {
		j.Repeats = &e.repeats
	}
	return j
}

// idsOf is the ids an entry's answer showed, in its order: [] but for a 200 GET of the
// four operations, and a shipment's 201 (its id).
func (d *tenantData) idsOf(e *journalEntry) []string {
	ids := []string{}
	if e.shown.kind == showsWritten && e.status == http.StatusCreated { // a shipment's 201, or its replay
		return append(ids, e.shown.ship.id)
	}
	if !e.read() {
		return ids
	}
	switch e.shown.kind {
	case showsOrder:
		ids = append(ids, string(d.orders.idOf(int(e.shown.order))))
	case showsShipment:
		ids = append(ids, e.shown.ship.id)
	case showsPage:
		d.orders.pageOrders(&e.shown.page, e.clock, func(i int) { ids = append(ids, string(d.orders.idOf(i))) })
	}
	return ids
}

// findingsAnswer is GET /v1/test_helpers/findings's answer, its members in this order: the
// first maxFindings findings, and how many more the entries hold.
type findingsAnswer struct {
	Data    []finding   `json:"data"`
	More    int         `json:"more"`
	Judged  *judgedSeqs `json:"judged"`
	Dropped uint64      `json:"dropped"`
}

type judgedSeqs struct {
	From uint64 `json:"from_seq"`
	To   uint64 `json:"to_seq"`
}

// finding is one trap the entries show the integration fell into, as an answer writes it.
type finding struct {
	Code     string   `json:"code"`
	Detail   string   `json:"detail"`
	Requests []uint64 `json:"requests"`
	ID       *string  `json:"id"`
}

// maxFindings is the most findings one answer writes; more counts the rest.
const maxFindings = 1000

// ===== The findings =====

// The findings, one table of them: each kind's code, its definition (what the entries show:
// the document's enum and the findings table of docs/journal-and-findings.md say it in these
// words, and TestFindingsAreOneTable holds them to it) and how its detail, what the client
// should change, is written. The functions below find them without writing a word, so that
// counting a journal's findings costs what finding them costs; a detail is written only for a
// finding an answer shows.

// findingCode is a kind of finding: its place in findingKinds, which is the order of the
// codes, so that findings of one seq sort by code.
type findingCode uint8

const (
	findingAmbiguousNumber findingCode = iota
	findingBlindRetry
	findingMissedImport
	findingParcelNumberLookup
	findingRetryTooSoon
	findingStaleOrder
)

type findingKind struct {
	code       string
	definition string // what the entries show, in the document's words and docs/journal-and-findings.md's
	advice     string // what the client should change, as its detail says
	detail     func(d *tenantData, es []journalEntry, f *rawFinding) string
	gradeOrder int // where an exam's grade lists its check: the retry's, the order findings', the tracking number's, the write's, the parcel's
}

var findingKinds = [...]findingKind{
	findingAmbiguousNumber: {"ambiguous_number",
		"a 404 of GET /v1/tracking/{tracking_number} whose number two or more shipments held at that instant; one finding per number, citing its first and last such lookups",
		"the live domain adapter will answer 409 there: look the shipment up by its id", ambiguousDetail, 3},
	findingBlindRetry: {"blind_retry",
		"a write answered 502 sent again by the same key once that answer had come, under another Idempotency-Key: a booking (POST /v1/test_helpers/shipments with an order_id) for the same order_id with no 200 read showing that order in between; any other write with the same method, path and query and the same body; one finding per 502, citing it and its first such retry",
		"retry a 502 with the same Idempotency-Key, which answers the first write's result (or read the order before booking it anew)", blindDetail, 4},
	findingMissedImport: {"missed_import",
		"an order imported after its created_at that no request judged at or after its import showed, although a page judged before its import held its place (its created_from..created_to held its created_at, its status filter, if any, let it through, and the page reached its place in the list) and a later read was made: a created_from watermark went past it",
		"re-read a window that looks back further than imports can be late", missedDetail, 1},
	findingParcelNumberLookup: {"parcel_number_lookup",
		"a 404 of GET /v1/tracking/{tracking_number} whose number was, at that instant, a further parcel's number of a shipment found then and no shipment's primary number; one finding per number, citing its first and last such lookups",
		"a lookup by number matches the primary tracking number only: read the consignment by its shipment id", parcelDetail, 5},
	findingRetryTooSoon: {"retry_too_soon",
		"a request sent again (same key, method, path and query) while an earlier answer's Retry-After was still running, counted from the end of that answer; one finding per key, method and target, citing the first such answer and its first early retry",
		"wait at least the Retry-After seconds (429, 503) before sending it again", retryDetail, 0},
	findingStaleOrder: {"stale_order",
		"an order whose status or shipment_id at the latest instant read differs from what it showed when last seen, unless a page with a status filter it had left reached its place after that (a client that polls one status learns of a change when the order leaves it)",
		"keep re-reading the orders you follow (by id, or in a window that looks back) until they settle", staleDetail, 2},
}

// rawFinding is a finding as judged, before its detail is written: its kind, the entries it cites
// (indexes into the entries judged, which are in seq order; the second -1 when it cites
// one), the order with a timeline it names (its place among them, -1 for none) and a count
// its detail tells.
type rawFinding struct {
	kind  findingCode
	cited [2]int32
	m     int32
	n     int32
}

// rawFindings is every finding of the entries es, judged against d (each entry against
// the version it read), none written, oldest first:
// by their first cited seq, then code. The order findings share one walk of the entries.
func (d *tenantData) rawFindings(es []journalEntry) []rawFinding {
	fs := retriesTooSoon(es)
	fs = append(fs, sharedNumbers(es)...)
	fs = append(fs, parcelLookups(es)...)
	fs = append(fs, blindRetries(es)...)
	fs = append(fs, d.blindBookings(es)...)
	fs = append(fs, d.orderFindings(es)...)
	slices.SortStableFunc(fs, func(a, b rawFinding) int {
		if c := cmp.Compare(a.cited[0], b.cited[0]); c != 0 {
			return c
		}
		return cmp.Compare(a.kind, b.kind)
	})
	return fs
}

// findingsIn is the first most findings of the entries es, written, and how many they hold.
func (d *tenantData) findingsIn(es []journalEntry, most int) ([]finding, int) {
	fs := d.rawFindings(es)
	written := make([]finding, 0, min(most, len(fs)))
	for i := range fs[:min(most, len(fs))] {
		written = append(written, d.written(es, &fs[i]))
	}
	return written, len(fs)
}

// written is f as an answer writes it.
func (d *tenantData) written(es []journalEntry, f *rawFinding) finding {
	k := &findingKinds[f.kind]
	w := finding{Code: k.code, Detail: k.detail(d, es, f), Requests: []uint64{es[f.cited[0]].seq}}
	if f.cited[1] >= 0 {
		w.Requests = append(w.Requests, es[f.cited[1]].seq)
	}
	switch a := &es[f.cited[0]]; {
	case f.m >= 0:
		id := d.orders.timedID(int(f.m))
		w.ID = &id
	case f.kind == findingBlindRetry && a.shown.kind == showsWritten: // the shipment the 502's write created
		w.ID = &a.shown.ship.id
	case f.kind == findingBlindRetry && a.write.orderID != "": // a booking not done: its order
		w.ID = &a.write.orderID
	case f.kind == findingParcelNumberLookup:
		w.ID = &a.shown.ship.id
	}
	return w
}

// retriesTooSoon finds, for each key, method and target, the requests sent while an
// earlier answer's Retry-After was running: from the end of that answer (its arrival and
// duration) for its Retry-After seconds.
func retriesTooSoon(es []journalEntry) []rawFinding {
	type sent struct {
		key            *apiKey
		method, target string
	}
	var fs []rawFinding
	for _, g := range groupsOf(es, func(e *journalEntry) (sent, bool) { return sent{e.key, e.method, e.target}, true },
		func(e *journalEntry) bool { return e.retryAfter >= 0 }) {
		if f, ok := tooSoon(es, g); ok {
			fs = append(fs, f)
		}
	}
	return fs
}

// groupsOf is the entries of es (indexes, in seq order) grouped by the key each has (ok
// false: in no group), of the groups that hold an entry marked says, in the order of their
// first such entry: a judge of retries asks only the groups that hold what is retried.
func groupsOf[K comparable](es []journalEntry, key func(e *journalEntry) (K, bool), marked func(e *journalEntry) bool) [][]int {
	var order []K
	groups := map[K][]int{}
	for i := range es {
		if k, ok := key(&es[i]); ok && marked(&es[i]) && groups[k] == nil {
			order = append(order, k)
			groups[k] = []int{}
		}
	}
	for i := range es {
		if k, ok := key(&es[i]); ok && groups[k] != nil {
			groups[k] = append(groups[k], i)
		}
	}
	out := make([][]int, len(order))
	for n, k := range order {
		out[n] = groups[k]
	}
	return out
}

// retryWindow is an answer's Retry-After: from the end of the answer, for its seconds.
func retryWindow(e *journalEntry) (from, until int64) {
	from = e.arrived + e.duration
	return from, from + int64(e.retryAfter)*int64(time.Second)
}

// tooSoon judges the entries of one key, method and target (indexes into es, in seq
// order): a finding when one was sent within an earlier one's Retry-After. It counts each
// such entry once, and cites the first answer with such an entry, and its first.
func tooSoon(es []journalEntry, group []int) (rawFinding, bool) {
	byArrival := slices.Clone(group)
	slices.SortStableFunc(byArrival, func(a, b int) int { return cmp.Compare(es[a].arrived, es[b].arrived) })
	count, repeated := earlyRetries(es, group, byArrival), -1
	for _, i := range group { // an attempt's 429s of one second, counted in its entry: each sent inside its window
		if es[i].repeats > 0 && es[i].retryAfter >= 0 {
			count += int(es[i].repeats)
			if repeated < 0 {
				repeated = i
			}
		}
	}
	if count == 0 {
		return rawFinding{}, false
	}
	a, b := firstEarly(es, group, byArrival)
	if a < 0 { // its repeats alone: the entry is the answer and the retry both
		a, b = repeated, repeated
	}
	return rawFinding{kind: findingRetryTooSoon, cited: [2]int32{int32(a), int32(b)}, m: -1, n: int32(count)}, true
}

func retryDetail(_ *tenantData, es []journalEntry, f *rawFinding) string {
	A, B, count := &es[f.cited[0]], &es[f.cited[1]], int(f.n)
	if A == B {
		return fmt.Sprintf("%s %s was sent %d %s before the Retry-After of an earlier answer had passed: request %d was answered %d with Retry-After: %d, and %d more were sent in that second (its repeats); wait at least the Retry-After seconds before sending it again.",
			A.method, A.target, count, plural(count, "time", "times"), A.seq, A.status, A.retryAfter, A.repeats)
	}
	from, _ := retryWindow(A)
	return fmt.Sprintf("%s %s was sent %d %s before the Retry-After of an earlier answer had passed: request %d came %s after request %d was answered %d with Retry-After: %d; wait at least the Retry-After seconds before sending it again.",
		A.method, A.target, count, plural(count, "time", "times"), B.seq, formatSeconds(B.arrived-from), A.seq, A.status, A.retryAfter)
}

// earlyRetries counts the entries sent within the Retry-After of another: a sweep over the
// entries by arrival, beside the windows by start, that keeps the two windows running
// longest (an entry is never a retry of itself).
func earlyRetries(es []journalEntry, group, byArrival []int) int {
	var windows []int // the entries with a Retry-After, by the start of their window
	for _, i := range group {
		if es[i].retryAfter >= 0 {
			windows = append(windows, i)
		}
	}
	slices.SortStableFunc(windows, func(a, b int) int {
		fa, _ := retryWindow(&es[a])
		fb, _ := retryWindow(&es[b])
		return cmp.Compare(fa, fb)
	})
	type open struct {
		until int64
		of    int
	}
	first, second := open{math.MinInt64, -1}, open{math.MinInt64, -1}
	count, w := 0, 0
	for _, b := range byArrival {
		for ; w < len(windows); w++ {
			from, until := retryWindow(&es[windows[w]])
			if from > es[b].arrived {
				break
			}
			switch o := (open{until, windows[w]}); {
			case o.until > first.until:
				first, second = o, first
			case o.until > second.until:
				second = o
			}
		}
		best := first
		if best.of == b {
			best = second
		}
		if best.of >= 0 && es[b].arrived < best.until {
			count++
		}
	}
	return count
}

// firstEarly is the first answer, by seq, with an entry sent within its Retry-After, and
// the first such entry (indexes into es): a search of the entries by arrival for each
// answer's window.
func firstEarly(es []journalEntry, group, byArrival []int) (a, b int) {
	b = -1
	for _, i := range group {
		if es[i].retryAfter < 0 {
			continue
		}
		from, until := retryWindow(&es[i])
		k := sort.Search(len(byArrival), func(k int) bool { return es[byArrival[k]].arrived >= from })
		for ; k < len(byArrival) && es[byArrival[k]].arrived < until; k++ {
			if x := byArrival[k]; x != i && (b < 0 || x < b) {
				b = x
			}
		}
		if b >= 0 {
			return i, b
		}
	}
	return -1, -1
}

// sharedNumbers finds the lookups by a tracking number that several shipments held at the
// lookup's instant: one finding a number, citing its first and last.
func sharedNumbers(es []journalEntry) []rawFinding {
	return numberLookups(es, showsSharedNumber, findingAmbiguousNumber, func(e *journalEntry) string { return *e.shown.ship.trackingNumber })
}

// parcelLookups finds the lookups by a further parcel's number, which match no shipment
// (lookup matches the primary number only): one finding a number, citing its first and last.
func parcelLookups(es []journalEntry) []rawFinding {
	return numberLookups(es, showsParcelNumber, findingParcelNumberLookup, func(e *journalEntry) string { return e.shown.ship.parcels[e.shown.order] })
}

// numberLookups finds the 404s of GET /v1/tracking/{n} whose answer showed kind: one finding
// of code a number (as number reads it off the entry), citing its first and last such lookups.
func numberLookups(es []journalEntry, kind showingKind, code findingCode, number func(e *journalEntry) string) []rawFinding {
	var numbers []string
	lookups := map[string][]int32{}
	for i := range es {
		e := &es[i]
		if e.method != http.MethodGet || e.status != http.StatusNotFound || e.shown.kind != kind {
			continue
		}
		n := number(e)
		if lookups[n] == nil {
			numbers = append(numbers, n)
		}
		lookups[n] = append(lookups[n], int32(i))
	}
	var fs []rawFinding
	for _, n := range numbers {
		l := lookups[n]
		f := rawFinding{kind: code, cited: [2]int32{l[0], -1}, m: -1, n: int32(len(l))}
		if len(l) > 1 {
			f.cited[1] = l[len(l)-1]
		}
		fs = append(fs, f)
	}
	return fs
}

func parcelDetail(_ *tenantData, es []journalEntry, f *rawFinding) string {
	e, n := &es[f.cited[0]], int(f.n)
	return fmt.Sprintf("Tracking number %s is a further parcel's of shipment %s, so a lookup by it answered 404 (%d %s): lookup by number matches the primary tracking number only; read the consignment by its shipment id, GET /v1/shipments/%s/tracking.",
		strconv.Quote(e.shown.ship.parcels[e.shown.order]), e.shown.ship.id, n, plural(n, "lookup", "lookups"), e.shown.ship.id)
}

func ambiguousDetail(_ *tenantData, es []journalEntry, f *rawFinding) string {
	n := int(f.n)
	return fmt.Sprintf("Tracking number %s was held by more than one shipment when it was looked up (%d %s), so the sandbox answered 404; the live domain adapter will answer 409 Conflict there: look the shipment up by its id, GET /v1/shipments/{id}/tracking.",
		strconv.Quote(*es[f.cited[0]].shown.ship.trackingNumber), n, plural(n, "lookup", "lookups"))
}

// blindRetries finds the writes answered 502, which were done, that were sent again once
// that answer had come (same key, method, target and body) under another Idempotency-Key:
// a second write, where the same key would have answered the first's result. Only groups
// with a 502 are kept; each 502 looks on to its first such retry.
func blindRetries(es []journalEntry) []rawFinding {
	type sent struct {
		key            *apiKey
		method, target string
		body           [sha256.Size]byte
	}
	var fs []rawFinding
	for _, g := range groupsOf(es, func(e *journalEntry) (sent, bool) {
		if e.write == nil || e.write.orderID != "" { // a booking is judged by its order (blindBookings)
			return sent{}, false
		}
		return sent{e.key, e.method, e.target, e.write.body}, true
	}, func(e *journalEntry) bool { return e.status == http.StatusBadGateway }) {
		fs = append(fs, blindRetriesOf(es, g)...)
	}
	return fs
}

// blindRetriesOf judges the entries of one key, method, target and body (indexes into es,
// in seq order): each 502 looks for the first later entry that arrived once its answer had
// come, a search of the arrivals' ranks in a tree of their maxima, and passes over those of
// its own Idempotency-Key (its replays). Requests sent all at once, each arriving before
// the others' answers, would otherwise make each 502 look at all the rest.
func blindRetriesOf(es []journalEntry, l []int) []rawFinding {
	arrivals := make([]int64, len(l))
	for k, i := range l {
		arrivals[k] = es[i].arrived
	}
	slices.Sort(arrivals)
	rank := func(at int64) int32 { // of the first arrival at or after at, plus one
		r, _ := slices.BinarySearch(arrivals, at)
		return int32(r + 1)
	}
	arrived := newMaxTree(len(l))
	for k, i := range l {
		arrived.put(k, rank(es[i].arrived))
	}
	var fs []rawFinding
	for k, a := range l {
		A := &es[a]
		if A.status != http.StatusBadGateway {
			continue
		}
		after := rank(A.arrived + A.duration)
		for lo := k + 1; ; {
			b := arrived.firstAtLeast(lo, after)
			if b == len(l) {
				break
			}
			if es[l[b]].write.key != A.write.key {
				fs = append(fs, rawFinding{kind: findingBlindRetry, cited: [2]int32{int32(a), int32(l[b])}, m: -1})
				break
			}
			lo = b + 1
		}
	}
	return fs
}

// blindBookings finds the bookings (POST /v1/test_helpers/shipments with an order_id)
// answered 502, done or not, that the same key booked again for the same order once that
// answer had come, under another Idempotency-Key, with no 200 read showing that order between
// the 502's end and the new booking's arrival: a client that looked, saw no shipment and
// booked anew did not retry blindly.
func (d *tenantData) blindBookings(es []journalEntry) []rawFinding {
	type booked struct {
		key   *apiKey
		order string
	}
	groups := groupsOf(es, func(e *journalEntry) (booked, bool) {
		if e.write == nil || e.write.orderID == "" {
			return booked{}, false
		}
		return booked{e.key, e.write.orderID}, true
	}, func(e *journalEntry) bool { return e.status == http.StatusBadGateway })
	if len(groups) == 0 {
		return nil
	}
	reads := map[string][][2]int64{} // for each order booked and answered 502: the reads that showed it, from arrival to end
	for _, g := range groups {
		reads[es[g[0]].write.orderID] = nil
	}
	for i := range es {
		if e := &es[i]; e.read() {
			for _, id := range d.idsOf(e) {
				if r, ok := reads[id]; ok {
					reads[id] = append(r, [2]int64{e.arrived, e.arrived + e.duration})
				}
			}
		}
	}
	var fs []rawFinding
	for _, g := range groups {
		byArrival := slices.Clone(g)
		slices.SortStableFunc(byArrival, func(a, b int) int { return cmp.Compare(es[a].arrived, es[b].arrived) })
		for _, a := range g {
			A := &es[a]
			if A.status != http.StatusBadGateway {
				continue
			}
			end := A.arrived + A.duration
			k, _ := slices.BinarySearchFunc(byArrival, end, func(i int, at int64) int { return cmp.Compare(es[i].arrived, at) })
			for ; k < len(byArrival) && (byArrival[k] == a || es[byArrival[k]].write.key == A.write.key); k++ {
			}
			if k == len(byArrival) {
				continue
			}
			B := &es[byArrival[k]]
			looked := slices.ContainsFunc(reads[A.write.orderID], func(r [2]int64) bool { return r[0] >= end && r[1] <= B.arrived })
			if !looked {
				fs = append(fs, rawFinding{kind: findingBlindRetry, cited: [2]int32{int32(a), int32(byArrival[k])}, m: -1})
			}
		}
	}
	return fs
}

func blindDetail(_ *tenantData, es []journalEntry, f *rawFinding) string {
	A, B := &es[f.cited[0]], &es[f.cited[1]]
	if A.write.orderID != "" && (B.write.body != A.write.body || A.simulated == byScript && A.shown.kind != showsWritten) {
		return fmt.Sprintf("%s %s for order %s was answered 502 (request %d): the booking may or may not have been done; request %d booked the order again under another Idempotency-Key (%s, not %s) without reading it in between: retry a 502 with the same Idempotency-Key, which answers the first write's result, or read the order first (GET /v1/orders/{id} shows its shipment_id) before booking it anew.",
			A.method, A.target, A.write.orderID, A.seq, B.seq, strconv.Quote(B.write.key), strconv.Quote(A.write.key))
	}
	return fmt.Sprintf("%s %s was answered 502 (request %d), but the write was done; request %d sent the same body again under another Idempotency-Key (%s, not %s), which writes a second time (a second link of an order is 409 order_already_linked): retry a 502 with the same Idempotency-Key, which answers the first write's result.",
		A.method, A.target, A.seq, B.seq, strconv.Quote(B.write.key), strconv.Quote(A.write.key))
}

// orderFindings finds the orders the entries missed (imported late, behind what a list had
// read, and never shown after) and those whose last sighting is stale at the latest
// instant read. Only orders with a timeline move, so only those are followed, in list
// order, beside the pages that held their places (heldPages): the cost is what the pages
// cost when they were read, and a search per order with a timeline, however many pages
// the journal holds.
func (d *tenantData) orderFindings(es []journalEntry) []rawFinding {
	ix := &d.orders
	seen := make([]int32, ix.timedCount()) // each order with a timeline: the entry that showed it at the latest instant (ties: the higher seq), plus one
	var pages []readPage
	latest := -1 // the read judged at the latest instant (ties: the highest seq)
	see := func(m, i int) {
		if s := seen[m]; s == 0 || laterRead(&es[i], &es[s-1]) {
			seen[m] = int32(i + 1)
		}
	}
	for i := range es {
		e := &es[i]
		if !e.read() {
			continue
		}
		if latest < 0 || laterRead(e, &es[latest]) {
			latest = i
		}
		switch e.shown.kind {
		case showsOrder:
			if m, ok := ix.timedOf(int(e.shown.order)); ok {
				see(m, i)
			}
		case showsPage:
			pages = append(pages, readPage{at: e.clock, page: &e.shown.page, entry: int32(i)})
			ix.pageTimed(&e.shown.page, e.clock, func(m int) { see(m, i) })
		}
	}
	if latest < 0 {
		return nil
	}
	held, last := ix.newHeldPages(pages), es[latest].clock
	var fs []rawFinding
	for m := range ix.timedCount() {
		held.reach(int(ix.timed[m]))
		if s := int(seen[m]) - 1; s >= 0 {
			if d.staleOrder(m, &es[s], &es[latest], held) {
				fs = append(fs, rawFinding{kind: findingStaleOrder, cited: [2]int32{int32(s), int32(latest)}, m: int32(m)})
			}
		} else if h := d.missedImport(m, last, held); h >= 0 {
			fs = append(fs, rawFinding{kind: findingMissedImport, cited: [2]int32{int32(h), int32(latest)}, m: int32(m)})
		}
	}
	return fs
}

// laterRead reports whether a was judged after b, or at the same instant with a higher seq.
func laterRead(a, b *journalEntry) bool {
	c := a.clock.compare(b.clock)
	return c > 0 || c == 0 && a.seq > b.seq
}

// staleOrder reports whether the m-th order with a timeline, last seen by the entry seen,
// stands otherwise as the entry last, judged at the latest instant read, saw it (each
// entry judged against the data its own request read), unless a page judged after seen
// and by last, whose filter its status then left, reached its place (a client that polls
// one status learns of a change when the order leaves it).
func (d *tenantData) staleOrder(m int, seen, last *journalEntry, held *heldPages) bool {
	then, _ := d.orders.timedState(m, seen.clock, seen.writes)
	now, _ := d.orders.timedState(m, last.clock, last.writes)
	return (then.status != now.status || then.linked != now.linked) && !held.leftBetween(m, seen.clock, last.clock)
}

func staleDetail(d *tenantData, es []journalEntry, f *rawFinding) string {
	ix, m, s, latest := &d.orders, int(f.m), &es[f.cited[0]], &es[f.cited[1]]
	then, _ := ix.timedState(m, s.clock, s.writes)
	now, _ := ix.timedState(m, latest.clock, latest.writes)
	return fmt.Sprintf("Order %s was last seen %s (request %d, at %s), but at %s (request %d) it is %s: keep re-reading the orders you follow (by id, or with a window that looks back) until they settle.",
		ix.timedID(m), ix.stateText(m, then), s.seq, formatInstant(s.clock), formatInstant(latest.clock), latest.seq, ix.stateText(m, now))
}

// missedImport judges the m-th order with a timeline, which no read showed: it was missed
// when it was imported late, by last, the latest instant read, and a page judged before its
// import held its place with a filter it then matched. It returns that page's entry (of
// them, the highest seq), or -1.
func (d *tenantData) missedImport(m int, last instant, held *heldPages) int {
	created, imported := d.orders.timedInstants(m)
	if !imported.after(created) || imported.after(last) {
		return -1
	}
	return held.heldBefore(m, imported)
}

func missedDetail(d *tenantData, es []journalEntry, f *rawFinding) string {
	ix, m, held, latest := &d.orders, int(f.m), &es[f.cited[0]], &es[f.cited[1]]
	created, imported := ix.timedInstants(m)
	return fmt.Sprintf("Order %s (created_at %s) was imported at %s, behind what request %d had listed, and no request judged after its import showed it (the last read, request %d, was judged at %s): a created_from watermark misses orders imported late, so re-read a window that looks back further than imports can be late.",
		ix.timedID(m), formatInstant(created), formatInstant(imported), held.seq, latest.seq, formatInstant(latest.clock))
}

// plural is one or many, as n says.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// formatSeconds writes ns as seconds, to the millisecond: 0.250 s.
func formatSeconds(ns int64) string { return strconv.FormatFloat(float64(ns)/1e9, 'f', 3, 64) + " s" }

// ===== The journal as HAR =====

// A HAR 1.2 log of the journal's entries, which a browser's developer tools open: every
// member HAR 1.2 requires, -1 where a size is unknown.

type (
	harLog struct {
		Log harBody `json:"log"`
	}
	harBody struct {
		Version string     `json:"version"`
		Creator harCreator `json:"creator"`
		Entries []harEntry `json:"entries"`
	}
	harCreator struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	harEntry struct {
		StartedDateTime string      `json:"startedDateTime"`
		Time            float64     `json:"time"`
		Request         harRequest  `json:"request"`
		Response        harResponse `json:"response"`
		Cache           struct{}    `json:"cache"`
		Timings         harTimings  `json:"timings"`
		Seq             uint64      `json:"_seq"` // custom members start with _
	}
	harRequest struct {
		Method      string       `json:"method"`
		URL         string       `json:"url"`
		HTTPVersion string       `json:"httpVersion"`
		Cookies     []harPair    `json:"cookies"`
		Headers     []harPair    `json:"headers"`
		QueryString []harPair    `json:"queryString"`
		PostData    *harPostData `json:"postData,omitempty"` // a trace's writes only
		HeadersSize int          `json:"headersSize"`
		BodySize    int64        `json:"bodySize"`
	}
	harPostData struct {
		MimeType string `json:"mimeType"`
		Text     string `json:"text"`
		Encoding string `json:"_encoding,omitempty"` // "base64" for a body that is not UTF-8: HAR's postData has no encoding
	}
	harResponse struct {
		Status      int        `json:"status"`
		StatusText  string     `json:"statusText"`
		HTTPVersion string     `json:"httpVersion"`
		Cookies     []harPair  `json:"cookies"`
		Headers     []harPair  `json:"headers"`
		Content     harContent `json:"content"`
		RedirectURL string     `json:"redirectURL"`
		HeadersSize int        `json:"headersSize"`
		BodySize    int64      `json:"bodySize"`
	}
	harPair struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	harContent struct {
		Size     int64   `json:"size"`
		MimeType string  `json:"mimeType"`
		Text     *string `json:"text,omitempty"`    // a trace's
		Comment  string  `json:"comment,omitempty"` // a trace's: why a text is left out
	}
	harTimings struct {
		Send    float64 `json:"send"`
		Wait    float64 `json:"wait"`
		Receive float64 `json:"receive"`
	}
)

// harOf is es as a HAR log, their URLs under origin (the address the reader used).
func harOf(es []journalEntry, origin string) harLog {
	log := harLog{harBody{Version: "1.2", Creator: harCreator{"shipping-api-sandbox", "v1"}, Entries: []harEntry{}}}
	for i := range es {
		log.Log.Entries = append(log.Log.Entries, harEntryOf(&es[i], origin))
	}
	return log
}

// harEntryOf is the journal's entry e as HAR writes it, its URL under origin.
func harEntryOf(e *journalEntry, origin string) harEntry {
	ms := e.durationMS()
	req := harRequest{Method: e.method, URL: origin + e.target, HTTPVersion: "HTTP/1.1", Cookies: []harPair{},
		Headers: []harPair{{"Authorization", "Bearer " + e.key.mask}}, QueryString: queryPairs(e.target), HeadersSize: -1}
	if e.hasPrefer {
		req.Headers = append(req.Headers, harPair{"Prefer", e.prefer})
	}
	if e.hasIdempotencyKey {
		req.Headers = append(req.Headers, harPair{"Idempotency-Key", e.idempotencyKey})
	}
	req.BodySize = e.bodySize // the body's size: the journal keeps no body
	text := statusTitle(int(e.status))
	if e.status == 499 {
		text = "Client Closed Request" // nginx's name: the client went away before any answer
	}
	resp := harResponse{Status: int(e.status), StatusText: text, HTTPVersion: "HTTP/1.1", Cookies: []harPair{},
		Headers: []harPair{{"Request-Id", e.requestID}}, Content: harContent{Size: e.size, MimeType: e.contentType}, HeadersSize: -1, BodySize: e.size}
	if e.retryAfter >= 0 {
		resp.Headers = append(resp.Headers, harPair{"Retry-After", strconv.Itoa(int(e.retryAfter))})
	}
	if e.contentType != "" {
		resp.Headers = append(resp.Headers, harPair{"Content-Type", e.contentType})
	}
	if e.method == http.MethodHead && e.size >= 0 {
		resp.BodySize = 0 // the answer to a HEAD has a Content-Length but no body
	}
	return harEntry{StartedDateTime: time.Unix(0, e.arrived).UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Time: ms, Request: req, Response: resp, Timings: harTimings{Wait: ms}, Seq: e.seq}
}

// queryPairs is the query of a target as HAR lists it: each pair, decoded where it can be.
func queryPairs(target string) []harPair {
	pairs := []harPair{}
	_, query, _ := strings.Cut(target, "?")
	for p, rest, ok := nextParam(query); ok; p, rest, ok = nextParam(rest) {
		v, err := p.value()
		if err != nil {
			v = p.rawValue
		}
		pairs = append(pairs, harPair{p.name, v})
	}
	return pairs
}

// ===== The reads' queries =====

const defaultJournalRead = 100 // entries a read answers when it names no limit

var errJournalOff = &apiError{code: codeNotFound, detail: "The journal is off: this sandbox was started with -journal 0 (or SANDBOX_JOURNAL=0). Start it with -journal N (1 to 100000 entries per account and environment; default 1000) to journal requests and judge them."}

// parseJournalQuery reads the query of a read of the journal: after and run, and for the
// requests limit and format. Faults are reported in the order the pairs were sent, each
// judged by its name, then by its value.
func parseJournalQuery(raw string, requests bool) (q journalRead, har bool, err error) {
	takes := "GET /v1/test_helpers/findings takes after and run."
	if requests {
		q.limit = defaultJournalRead
		takes = "GET /v1/test_helpers/requests takes after, limit, run and format."
	}
	var seen []string
	for p, rest, ok := nextParam(raw); ok; p, rest, ok = nextParam(rest) {
		switch p.name {
		case "after", "run":
		case "limit", "format":
			if requests {
				break
			}
			fallthrough
		default:
			return q, false, unknownParam(p.name, takes)
		}
		if slices.Contains(seen, p.name) {
			return q, false, paramError(codeInvalidParameter, p.name, p.name+" is given more than once; give it once.")
		}
		seen = append(seen, p.name)
		v, err := p.value()
		if err != nil {
			return q, false, err
		}
		if har, err = readJournalParam(&q, p.name, v, har); err != nil {
			return q, false, err
		}
	}
	return q, har, nil
}

// readJournalParam reads one parameter's value into q (format into har).
func readJournalParam(q *journalRead, name, v string, har bool) (bool, error) {
	switch name {
	case "after":
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return har, paramError(codeInvalidParameter, name, "after must be a seq: a whole number from 0, such as the last_seq of an earlier read.")
		}
		q.after = n
	case "limit":
		n, ok := parseWhole(v, maxJournalRead)
		if !ok || n < 1 {
			return har, paramError(codeInvalidParameter, name, fmt.Sprintf("limit must be a whole number from 1 to %d.", maxJournalRead))
		}
		q.limit = n
	case "run":
		if !validRun(v) {
			return har, paramError(codeInvalidParameter, name, `run must be 1 to 64 characters of A-Z a-z 0-9 . _ -, as sent in Prefer: run="t-42".`)
		}
		q.runTag = v
	case "format":
		if v != "json" && v != "har" {
			return har, paramError(codeInvalidParameter, name, "format must be json (the default) or har (a HAR 1.2 log, which a browser's developer tools open).")
		}
		return v == "har", nil
	}
	return har, nil
}

// validRun reports whether a run tag is 1 to 64 characters of A-Z a-z 0-9 . _ -.
func validRun(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ===== What the page shows of a journal =====

// recentEntries copies t's journal's newest n entries, oldest first.
func (t *tenant) recentEntries(n int) []journalEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.journal
	if j == nil {
		return nil
	}
	es := make([]journalEntry, min(n, j.n))
	for k := range es {
		es[k] = j.ring[(j.oldest+j.n-len(es)+k)%len(j.ring)]
	}
	return es
}

// countFindings starts judging the findings of t's journal aside, unless they are counted
// up to its newest entry or a count runs already, and returns what is closed when the
// running count ends (nil when none runs). The page reads the count, never makes it: a
// journal of -journal 100000 entries may take a second to judge, and the page shows
// twenty. Each new entry is counted at most once.
func (t *tenant) countFindings() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.journal
	if j == nil {
		return nil
	}
	if j.counting == nil && j.counted.seq != j.last {
		done := make(chan struct{})
		j.counting = done
		go func() {
			defer close(done)
			t.recount(j)
		}()
	}
	return j.counting
}

// recount judges the findings of every entry t's journal j holds, and keeps how many there
// are and the first of them, written.
func (t *tenant) recount(j *journal) {
	part := t.journalPart(journalRead{})
	first, n := t.current().findingsIn(part.entries, pageFindings)
	t.mu.Lock()
	defer t.mu.Unlock()
	j.counting = nil
	if part.last > j.counted.seq {
		j.counted = findingsCount{part.last, n, first}
	}
}

// findingsCounted is the newest entry's seq, and the findings of the entries held when seq
// counted was the newest: how many, and the first pageFindings of them.
func (t *tenant) findingsCounted() (last uint64, c findingsCount) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.journal == nil {
		return 0, findingsCount{}
	}
	return t.journal.last, t.journal.counted
}

// ===== Sandboxes: accounts made at run time =====

// A sandbox is an account of its own, made while the service runs (POST
// /v1/test_helpers/sandboxes) as a copy of a dataset account or from records a test sends,
// with keys made for it: its tenant behaves as a dataset tenant does and sees nothing of any
// other account. Its data is built once, when it is made, from its records read against its
// own start instant. The registry holds at most maxSandboxes; each is forgotten sandboxIdle after
// the last request that named one of its keys and, past the bounds, the least recently used
// goes first, its journal and stored answers with it.

const (
	maxSandboxes      = 10000
	maxSandboxBytes   = 256 << 20 // what the sandboxes' data may hold together
	sandboxIdle       = time.Hour
	maxSandboxRecords = 10000 // the orders, or the shipments, a template may hold
	maxSandboxKeys    = 20
)

// sandboxTemplate is what a dataset keeps of a test tenant that a sandbox may copy: its
// records, read again against each sandbox's start instant as a fresh start of the dataset
// would read them (so a copy of acct_sync replays its two minutes from its creation).
type sandboxTemplate struct {
	orders    *orderRecords
	shipments []shipmentRecord
	keys      []keyRecord
	seeds     int
}

// keepTemplates keeps, for each test tenant of at most maxSandboxRecords orders (seeded ones
// counted) and shipments, its records apart; a larger one is kept as nil, a template no
// sandbox may copy. A dataset keeps at most its templates' records twice, and a large
// tenant's not at all. It runs while the orders are filed, before build stores them.
func (ld *loader) keepTemplates(ds *datasetFile, seed int) map[string]*sandboxTemplate {
	shipments, keys := map[tenantID][]shipmentRecord{}, map[tenantID][]keyRecord{}
	for _, rec := range ds.shipments {
		id := tenantID{rec.Account, rec.Environment}
		shipments[id] = append(shipments[id], rec)
	}
	for _, rec := range ds.keys {
		id := tenantID{rec.Account, rec.Environment}
		keys[id] = append(keys[id], rec)
	}
	templates := map[string]*sandboxTemplate{}
	for _, t := range ld.tenants.list {
		if t.live {
			continue
		}
		seeds := 0
		if t.id == seedTenant {
			seeds = seed
		}
		pending := t.current().orders.pending
		if len(pending)+seeds > maxSandboxRecords || len(shipments[t.id]) > maxSandboxRecords {
			templates[t.id.account] = nil
			continue
		}
		recs := make([]int32, len(pending))
		for i, p := range pending {
			recs[i] = p.rec
		}
		templates[t.id.account] = &sandboxTemplate{orders: ds.orders.copyOf(recs), shipments: shipments[t.id], keys: keys[t.id], seeds: seeds}
	}
	return templates
}

// sandboxAccount is what the registry keeps of a sandbox's tenant besides its data: its keys'
// digests, the data it shares with other copies of its template (nil when none), and its
// last use, under the registry's mu.
type sandboxAccount struct {
	digests  [][sha256.Size]byte
	shared   *sharedData
	lastUsed int64 // the wall clock, in ns, at the last request that named one of its keys
}

// The body of POST /v1/test_helpers/sandboxes, read as a dataset's records are.

// A shipment and a key as a request body sends them: their owner is the sandbox that holds
// them, and a key's text is made for it.
var (
	bodyShipmentShape = shipmentShape.without("account", "environment")
	bodyKeyShape      = keyShape.without("key", "account", "environment")
)

// sandboxRequest is the body as read: a template's account, or records, and keys; and the
// dataset's templates it may name.
type sandboxRequest struct {
	templates map[string]*sandboxTemplate
	template  *string          // the template named, nil when none is
	copied    *sandboxTemplate // the template named, found
	records   bool             // shipments or orders were sent
	shipments []shipmentRecord
	orders    *orderRecords
	keys      []keyRecord
	keysSent  bool
	profile   string // sandboxProfiles[0] unless sent
}

// sandboxProfiles are the profiles a sandbox may answer by: the sandbox's (the default), or
// the unreleased domain adapter's, where the spec says they differ.
var sandboxProfiles = []string{"sandbox", "domain_adapter"}

var (
	errSandboxBody = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, such as {} or {"template":"acct_sync"}.`}
	errCopyOrSend  = "A sandbox is a copy of a template or holds the records sent, not both: send template, or shipments and orders."
	errSandboxKeys = paramError(codeInvalidParameter, "keys", fmt.Sprintf("keys is a list of 1 to %d keys, each {\"scopes\":[...],\"expires_at\":...,\"revoked\":...}.", maxSandboxKeys))
	errProfile     = paramError(codeInvalidParameter, "profile", `profile is "sandbox" (the default: the sandbox's answers) or "domain_adapter" (where the spec says the unreleased domain adapter answers otherwise, as it will).`)
)

// sandboxRequestShape is the members of the body, one row a member, each read as it comes:
// a template among the dataset's templates, records (never beside a template: the later of
// the two is the fault), a list of keys by its length, a profile of sandboxProfiles. What the
// records hold is judged as they are filed, after the whole body, as a dataset's are.
var sandboxRequestShape = shapeOf(
	member[sandboxRequest]{"template", func(d *jsonReader, path, name string, req *sandboxRequest) (err error) {
		if req.records {
			return paramError(codeInvalidParameter, name, errCopyOrSend)
		}
		if req.template, err = d.optStr(path, name); err == nil && req.template != nil {
			req.copied, err = templateNamed(*req.template, req.templates)
		}
		return err
	}},
	member[sandboxRequest]{"shipments", func(d *jsonReader, path, name string, req *sandboxRequest) error {
		if req.template != nil {
			return paramError(codeInvalidParameter, name, errCopyOrSend)
		}
		req.records = true
		return readShaped(d, path+"."+name, &bodyShipmentShape, &req.shipments)
	}},
	member[sandboxRequest]{"orders", func(d *jsonReader, path, name string, req *sandboxRequest) error {
		if req.template != nil {
			return paramError(codeInvalidParameter, name, errCopyOrSend)
		}
		req.records = true
		return req.orders.readOrders(d, path+"."+name, &bodyOrderShape)
	}},
	member[sandboxRequest]{"keys", func(d *jsonReader, path, name string, req *sandboxRequest) error {
		req.keysSent = true
		if err := readShaped(d, path+"."+name, &bodyKeyShape, &req.keys); err != nil {
			return err
		}
		if len(req.keys) == 0 || len(req.keys) > maxSandboxKeys {
			return errSandboxKeys
		}
		return nil
	}},
	member[sandboxRequest]{"profile", func(d *jsonReader, path, name string, req *sandboxRequest) error {
		v, err := d.optStr(path, name)
		if err == nil && (v == nil || !slices.Contains(sandboxProfiles, *v)) {
			return errProfile
		}
		if err == nil {
			req.profile = *v
		}
		return err
	}},
)

// readSandboxRequest reads the body: its JSON syntax first (400), then its members in the
// order sent, each by its name, then given again, then its value (422).
func readSandboxRequest(b []byte, templates map[string]*sandboxTemplate) (*sandboxRequest, error) {
	if !oneJSONObject(b) {
		return nil, errSandboxBody
	}
	req := &sandboxRequest{templates: templates, orders: newOrderRecords(), profile: sandboxProfiles[0]}
	d := newJSONReader(bytes.NewReader(b), maxBodyBytes)
	if err := d.document(sandboxRequestShape.names, func(name string) error { return sandboxRequestShape.member(d, "$", name, req) }); err != nil {
		return nil, bodyFault(err)
	}
	return req, nil
}

// sandboxAnswer is POST /v1/test_helpers/sandboxes's answer, its members in this order.
type sandboxAnswer struct {
	Account     string          `json:"account"`
	Environment string          `json:"environment"`
	Template    *string         `json:"template"`
	Profile     string          `json:"profile"`
	StartedAt   string          `json:"started_at"`
	Keys        []sandboxKeyOut `json:"keys"`
	IdleSeconds int             `json:"idle_seconds"`
}

type sandboxKeyOut struct {
	Key       string   `json:"key"`
	Scopes    []string `json:"scopes"`
	ExpiresAt *string  `json:"expires_at"`
	Revoked   bool     `json:"revoked"`
}

// sandboxAlphabet is RFC 4648's base32 alphabet in lower case: a sandbox's account and keys.
const sandboxAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// randomText is n characters of sandboxAlphabet from crypto/rand (each byte's low five bits:
// 256 is a multiple of 32, so each character is as likely as any other).
func randomText(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = sandboxAlphabet[b[i]&31]
	}
	return string(b)
}

// newSandbox makes a sandbox of the body for the caller's key at the wall clock's now, from
// templates (the dataset's, by account): its tenant, its keys and its data, built by
// sandboxData; then keeps it in the registry, and returns its answer.
func (b *tenantRegistry) newSandbox(body []byte, caller *apiKey, templates map[string]*sandboxTemplate, now time.Time) ([]byte, error) {
	req, err := readSandboxRequest(body, templates)
	if err != nil {
		return nil, err
	}
	tpl, name, err := req.templateOf(caller, templates)
	if err != nil {
		return nil, err
	}
	keys := req.keys
	if !req.keysSent && tpl != nil {
		keys = tpl.keys
	}
	if len(keys) == 0 {
		keys = []keyRecord{{Scopes: scopeNames}}
	}
	start := now.UTC().Truncate(time.Second)
	t := newTenant(tenantID{"acct_" + randomText(20), "test"}, start)
	answer := sandboxAnswer{Account: t.id.account, Environment: t.id.environment, Template: name, Profile: req.profile, StartedAt: formatTimestamp(start), IdleSeconds: int(b.idle / time.Second)}
	made := map[[sha256.Size]byte]*apiKey{}
	for i, rec := range keys {
		k, out, err := sandboxKey(fmt.Sprintf("$.keys[%d]", i), rec, t)
		if err != nil {
			return nil, bodyFault(err)
		}
		made[sha256.Sum256([]byte(out.Key))] = k
		answer.Keys = append(answer.Keys, out)
	}
	var sh *sharedData
	if tpl != nil {
		sh = b.sharedCopy(tpl, start)
	}
	d, weight, sh, err := sandboxData(req, tpl, sh, t.id, start)
	if err != nil {
		return nil, err
	}
	t.data.Store(d)
	t.sandbox = &sandboxAccount{shared: sh}
	if err := b.add(t, caller.tenant, made, weight+int64(unsafe.Sizeof(tenant{})+unsafe.Sizeof(sandboxAccount{})), now); err != nil {
		return nil, err
	}
	return marshalJSON(answer)
}

// sandboxData is the data of the sandbox id started at start, as req asks, of its profile:
// a copy of tpl (the data the copies of tpl made at start share, sh, built when there is
// none yet), or the records req sends. A pure function: it builds what it returns, and edits
// nothing in place (the data a copy shares is the same for every profile; what names the
// tenant and its profile are the copy's own). It returns what the sandbox holds of its own,
// and the data it shares (nil when none), for the registry to count.
func sandboxData(req *sandboxRequest, tpl *sandboxTemplate, sh *sharedData, id tenantID, start time.Time) (*tenantData, int64, *sharedData, error) {
	if tpl == nil {
		built, err := buildSandboxData(id, start, req.orders, req.shipments, 0, true)
		if err != nil {
			return nil, 0, nil, bodyFault(err)
		}
		own := *built
		own.adapter = req.profile == "domain_adapter"
		return &own, own.bytes(), nil, nil
	}
	if sh == nil { // loaded at the dataset's start, not at this one: built anew, then shared
		built, err := buildSandboxData(id, start, tpl.orders, tpl.shipments, tpl.seeds, false)
		if err != nil {
			return nil, 0, nil, paramError(codeInvalidParameter, "template", "The template's records cannot be read at this sandbox's start instant: "+err.Error())
		}
		sh = &sharedData{template: tpl, start: start, data: built, bytes: built.bytes()}
	}
	own := *sh.data // only what names the tenant is its own: the cursors' tag, the names messages use, and its profile
	own.shipments.tenantName, own.orders.tenantName, own.orders.tag = id.String(), id.String(), tagOf("tenant", id.account, id.environment)
	own.adapter = req.profile == "domain_adapter"
	return &own, int64(unsafe.Sizeof(own)), sh, nil
}

// buildSandboxData files a sandbox's records as a dataset's tenant of id started at start
// would be, and returns its data.
func buildSandboxData(id tenantID, start time.Time, orders *orderRecords, shipments []shipmentRecord, seeds int, own bool) (*tenantData, error) {
	ld := newLoader(start)
	t := ld.addTenant(id)
	if err := fileSandbox(ld, t, orders, shipments, seeds, own); err != nil {
		return nil, err
	}
	return t.current(), nil
}

// templateOf is the template a request copies and its account (nil and nil when it sends
// records): the one it names, else the caller's account when that is the dataset's.
func (req *sandboxRequest) templateOf(caller *apiKey, templates map[string]*sandboxTemplate) (*sandboxTemplate, *string, error) {
	switch {
	case req.records:
		return nil, nil, nil
	case req.template != nil:
		return req.copied, req.template, nil
	case caller.tenant.sandbox != nil:
		return nil, nil, paramError(codeInvalidParameter, "template", "A sandbox's key makes a sandbox of a template it names (such as \"template\":\"acct_sync\") or of the records it sends.")
	}
	name := &caller.tenant.id.account
	tpl, err := templateNamed(*name, templates)
	return tpl, name, err
}

// templateNamed is the dataset's template of the account name, or why there is none: no
// test environment, or too large a one to copy.
func templateNamed(name string, templates map[string]*sandboxTemplate) (*sandboxTemplate, error) {
	tpl, ok := templates[name]
	switch {
	case !ok:
		return nil, paramError(codeInvalidParameter, "template", fmt.Sprintf("No account %q of the dataset has a test environment to copy.", name))
	case tpl == nil:
		return nil, paramError(codeInvalidParameter, "template", fmt.Sprintf("Account %q holds over %d orders or %d shipments: a sandbox is small, so that a write to it is cheap. Send the records a test needs instead.", name, maxSandboxRecords, maxSandboxRecords))
	}
	return tpl, nil
}

// sandboxKey makes a key of the sandbox t as rec says (its scopes, expiry and revocation),
// with its text, which only the answer shows.
func sandboxKey(path string, rec keyRecord, t *tenant) (*apiKey, sandboxKeyOut, error) {
	text := "sk_test_" + randomText(32)
	k := &apiKey{tenant: t, mask: keyMask(text), revoked: rec.Revoked, expiresAt: never}
	out := sandboxKeyOut{Key: text, Scopes: []string{}, Revoked: rec.Revoked}
	for i, name := range rec.Scopes {
		bit, err := oneOf(path, "scopes["+strconv.Itoa(i)+"]", "scope", name, scopeNames)
		if err != nil {
			return nil, out, err
		}
		if k.scopes&(1<<bit) == 0 {
			out.Scopes = append(out.Scopes, name)
		}
		k.scopes |= 1 << bit
	}
	if rec.ExpiresAt != nil {
		at, err := timestampField(path, "expires_at", *rec.ExpiresAt)
		if err != nil {
			return nil, out, err
		}
		k.expiresAt = instantOf(at)
		when := formatTimestamp(at)
		out.ExpiresAt = &when
	}
	return k, out, nil
}

// fileSandbox files a sandbox's records under its tenant t, as a dataset's are loaded, keeps
// where its orders come from for the writes that build them again (own: the records are
// the sandbox's, not a template's), and builds its indexes.
func fileSandbox(ld *loader, t *tenant, orders *orderRecords, shipments []shipmentRecord, seeds int, own bool) error {
	if err := ld.loadOrders(orders, t); err != nil {
		return err
	}
	d := t.current()
	if seeds > 0 {
		if err := d.orders.seedOrders(seeds); err != nil {
			return err
		}
	}
	d.source = &orderSource{recs: orders, seeds: seeds, own: own}
	if _, err := ld.loadShipments(shipments, t); err != nil {
		return err
	}
	_, _, err := ld.build()
	return err
}

// ===== Exams: the catalogue =====

// An exam is a named, versioned scenario of the spec's traps: a task a person or a coding
// agent can read, a world that moves on the attempt's own clock (records with instants
// relative to its start), what the task gives, and the checks its grade is made of. Three are
// built into the binary; each counts its own revisions.

// examDef is an exam of the catalogue: its task and checks, and its world, variant 0's
// written here; any other variant is drawn from it (examDef.worldOf).
type examDef struct {
	name, title, task string
	revision          int
	answer            string                            // the answer's member ("orders", "consignments"); "": graded from its world
	world             examWorld                         // variant 0
	vary              func(w *examWorld, r *mrand.Rand) // what a drawn variant changes beyond names, instants and platforms; nil: nothing
	checks            []examCheck
}

// examWorld is an exam's world as one variant draws it: its orders and shipments (instants
// relative to the attempt's start), the consignments its task gives (places in shipments;
// none but tracking's), and the booking's two creations answered 502 (the first creation for
// an order is 1): the one done, and the one not done; 0 for none.
type examWorld struct {
	orders      []examOrder
	shipments   []examShipment
	given       []givenConsignment
	unconfirmed [2]int32
}

// givenConsignment is a consignment a task gives: its shipment's place in the world's
// shipments, and the number given (-1: its primary number; else its further parcel's).
type givenConsignment struct {
	shipment, parcel int
}

// examOrder is an order of an exam's world, its instants relative to the attempt's start.
type examOrder struct {
	id, reference, platform, status string
	created                         time.Duration
	imported                        *time.Duration // nil: at its creation
	changes                         []examChange
}

type examChange struct {
	status string
	at     time.Duration
}

// examShipment is a shipment of an exam's world: created at the start (nil) or at an instant,
// for an order (orderID, "" for none), with its events (after the start, or before it).
type examShipment struct {
	id, reference, number string
	parcels               []string
	created               *time.Duration
	orderID               string
	events                []examEvent
}

type examEvent struct {
	after                      time.Duration
	status, description, where string
}

// examCheck is a check of a grade: its stable id, its title, and its verdict on a grading.
type examCheck struct {
	id, title string
	verdict   func(g *grading) checkVerdict // the check's verdict on a grading
}

// examDuration is how long an attempt lasts, examWindow how soon after a thing the world
// does a read must show it, and examAnswerTime how long after the deadline an answer may
// come: each times the attempt's scale.
const (
	examDuration   = 12 * time.Second
	examWindow     = 3 * time.Second
	examAnswerTime = 60 * time.Second
)

// maxVariant is the largest variant: a start that names none draws one from 1 to it.
const maxVariant = math.MaxInt32

// offset is an instant of a world, relative to the attempt's start, as a field that may be
// absent.
func offset(d time.Duration) *time.Duration { return &d }

// examCatalogue is the exams, in the order GET /v1/test_helpers/exams lists them.
var examCatalogue = []*examDef{orderSyncExam(), trackingExam(), bookingExam()}

// examNamed is the catalogue's exam of this name, or nil.
func examNamed(name string) *examDef {
	for _, e := range examCatalogue {
		if e.name == name {
			return e
		}
	}
	return nil
}

// findingChecks are the checks every exam has, one a finding code, in the order a grade
// lists them (each kind's gradeOrder): the retry's, the order findings', the tracking
// number's, the write's, the parcel's.
func findingChecks() []examCheck {
	codes := make([]findingCode, len(findingKinds))
	for i := range findingKinds {
		codes[i] = findingCode(i)
	}
	slices.SortFunc(codes, func(a, b findingCode) int { return cmp.Compare(findingKinds[a].gradeOrder, findingKinds[b].gradeOrder) })
	var checks []examCheck
	for _, code := range codes {
		k := &findingKinds[code]
		checks = append(checks, examCheck{"findings." + k.code, "no finding " + k.code + ": " + k.advice, verdictOnFindings(code)})
	}
	return checks
}

var completeCheck = examCheck{"journal.complete", "the attempt's journal lost no entry", verdictOnComplete}

func orderSyncExam() *examDef {
	e := &examDef{name: "order-sync", title: "Keep a copy of the imported orders", revision: 2, answer: "orders",
		task: "Keep a copy of this account's imported orders, each with its current status and shipment_id, from the start until the deadline; then answer with the copy: POST /v1/test_helpers/exams/{id}/answer (over MCP: answer_exam) with {\"orders\":[{\"id\",\"status\",\"shipment_id\"},...]}.",
		world: examWorld{orders: []examOrder{
			{id: "ord_exam_0001", reference: "EX-1001", platform: "amazon", status: "unfulfilled", created: -10 * time.Minute, changes: []examChange{{"partially_fulfilled", 3 * time.Second}, {"fulfilled", 6 * time.Second}}},
			{id: "ord_exam_0002", reference: "EX-1002", platform: "ebay", status: "unfulfilled", created: -5 * time.Minute, imported: offset(5 * time.Second)},
			{id: "ord_exam_0003", reference: "EX-1003", platform: "etsy", status: "unfulfilled", created: -2 * time.Minute},
			{id: "ord_exam_0004", reference: "EX-1004", platform: "shopify", status: "fulfilled", created: -2 * time.Minute},
			{id: "ord_exam_0005", reference: "EX-1005", platform: "tiktok_shop", status: "unfulfilled", created: -time.Minute, changes: []examChange{{"cancelled", 2 * time.Second}}},
			{id: "ord_exam_0006", reference: "EX-1006", platform: "shopify", status: "unfulfilled", created: 4 * time.Second},
		},
			shipments: []examShipment{{id: "shp_exam_1", reference: "EX-REF-1", number: "EXM1000000001", created: offset(3 * time.Second), orderID: "ord_exam_0001",
				events: []examEvent{{3 * time.Second, "pre_transit", "Label created", "Leeds, GB"}, {5 * time.Second, "in_transit", "Departed facility", "Leeds, GB"}}}}},
		vary: func(w *examWorld, r *mrand.Rand) { w.orders = append(w.orders[:6], oldOrders(21+r.IntN(7))...) }, // 21 to 27: two pages still
	}
	e.world.orders = append(e.world.orders, oldOrders(24)...)
	e.checks = append([]examCheck{
		{"answer.orders", "every order the account shows at the deadline, each once, no other", verdictOnAnswerOrders},
		{"answer.statuses", "each answered order's status as it stands at the deadline", verdictOnAnswerOrderStatuses},
		{"answer.links", "each answered order's shipment_id as it stands at the deadline", verdictOnAnswerLinks},
		{"journal.kept_current", "each thing the world does after the start (an import, a change of status, a link) shown within 3 s (times the scale)", verdictOnKeptCurrent},
	}, append(findingChecks(), examCheck{"journal.read_only", "no write done with the attempt's key", verdictOnReadOnly}, completeCheck)...)
	return e
}

// oldOrders are order-sync's n orders created hours before the start, all fulfilled: with
// the others, two pages at the default limit.
func oldOrders(n int) []examOrder {
	var orders []examOrder
	for i := 1; i <= n; i++ {
		orders = append(orders, examOrder{id: fmt.Sprintf("ord_exam_%04d", 100+i), reference: fmt.Sprintf("EX-%d", 2000+i), platform: platforms[(i-1)%len(platforms)],
			status: "fulfilled", created: -3*time.Hour + time.Duration(i)*time.Minute})
	}
	return orders
}

func trackingExam() *examDef {
	e := &examDef{name: "tracking", title: "Report the status of each consignment", revision: 2, answer: "consignments",
		task: "Report the tracking status of each consignment given, as it stands at the deadline; then answer: POST /v1/test_helpers/exams/{id}/answer (over MCP: answer_exam) with {\"consignments\":[{\"shipment_id\",\"status\"},...]}.",
		world: examWorld{shipments: []examShipment{
			{id: "shp_exam_t1", reference: "TRK-1", number: "EXT1000000001", events: []examEvent{{-time.Hour, "pre_transit", "Label created", "Leeds, GB"}, {2 * time.Second, "in_transit", "Departed facility", "Leeds, GB"},
				{6 * time.Second, "out_for_delivery", "Out for delivery", "York, GB"}, {10 * time.Second, "delivered", "Delivered", "York, GB"}}},
			{id: "shp_exam_t2", reference: "TRK-2", number: "EXT1000000002", events: []examEvent{{-2 * time.Hour, "pre_transit", "Label created", "Leeds, GB"}, {4 * time.Second, "in_transit", "Departed facility", "Leeds, GB"}}},
			{id: "shp_exam_t3", reference: "TRK-3", number: "EXT1000000002", events: []examEvent{{-30 * time.Minute, "pre_transit", "Label created", "Hull, GB"}, {8 * time.Second, "failure", "Delivery failed", "Hull, GB"}}},
			{id: "shp_exam_t4", reference: "TRK-4", number: "EXT1000000004", parcels: []string{"EXT1000000005", "EXT1000000006"},
				events: []examEvent{{-3 * time.Hour, "in_transit", "In transit", "Leeds, GB"}, {5 * time.Second, "available_for_pickup", "Available for pickup", "Leeds, GB"}}},
			{id: "shp_exam_t5", reference: "TRK-5", number: "EXT1000000007", events: []examEvent{{-24 * time.Hour, "delivered", "Delivered", "Bath, GB"}}},
		},
			given: []givenConsignment{{0, -1}, {1, -1}, {2, -1}, {3, 0}, {4, -1}}}, // t3 by the number t2 holds too; t4 by its second parcel's label
		vary: func(w *examWorld, r *mrand.Rand) {
			r.Shuffle(len(w.given), func(i, j int) { w.given[i], w.given[j] = w.given[j], w.given[i] })
			for i := range w.given {
				if w.given[i].parcel >= 0 {
					w.given[i].parcel = r.IntN(len(w.shipments[w.given[i].shipment].parcels))
				}
			}
		},
	}
	e.checks = append([]examCheck{
		{"answer.consignments", "each consignment given answered once, no other", verdictOnAnswerConsignments},
		{"answer.statuses", "each consignment's status as it stands at the deadline", verdictOnAnswerTrackingStatuses},
		{"journal.kept_current", "each event of a consignment given after the start shown within 3 s (times the scale)", verdictOnKeptCurrent},
	}, append(findingChecks(), examCheck{"journal.read_only", "no write done with the attempt's key", verdictOnReadOnly}, completeCheck)...)
	return e
}

func bookingExam() *examDef {
	e := &examDef{name: "booking", title: "Book each fulfilled order once", revision: 2,
		task: "Book one shipment for each fulfilled order that has none, exactly once, promptly, by the deadline (POST /v1/test_helpers/shipments with its order_id and a reference of your own); the provider does not always confirm a booking, and a booking it did not confirm may or may not have been done.",
		world: examWorld{orders: []examOrder{
			{id: "ord_exam_b1", reference: "BK-1", platform: "shopify", status: "fulfilled", created: -time.Hour},
			{id: "ord_exam_b2", reference: "BK-2", platform: "amazon", status: "fulfilled", created: -50 * time.Minute},
			{id: "ord_exam_b3", reference: "BK-3", platform: "ebay", status: "unfulfilled", created: -40 * time.Minute, changes: []examChange{{"fulfilled", 4 * time.Second}}},
			{id: "ord_exam_b4", reference: "BK-4", platform: "etsy", status: "unfulfilled", created: -30 * time.Minute},
			{id: "ord_exam_b5", reference: "BK-5", platform: "tiktok_shop", status: "partially_fulfilled", created: -20 * time.Minute},
			{id: "ord_exam_b6", reference: "BK-6", platform: "shopify", status: "cancelled", created: -10 * time.Minute},
			{id: "ord_exam_b7", reference: "BK-7", platform: "amazon", status: "fulfilled", created: -5 * time.Minute, imported: offset(6 * time.Second)},
			{id: "ord_exam_b8", reference: "BK-8", platform: "shopify", status: "fulfilled", created: -2 * time.Hour},
		},
			shipments:   []examShipment{{id: "shp_exam_b0", reference: "BK-REF-0", number: "EXB1000000000", orderID: "ord_exam_b8", events: []examEvent{{-time.Hour, "pre_transit", "Label created", "Leeds, GB"}}}},
			unconfirmed: [2]int32{1, 3}},
		vary: func(w *examWorld, r *mrand.Rand) { // two of the first four creations for an order: one done, one not
			p := r.Perm(4)
			w.unconfirmed = [2]int32{int32(p[0] + 1), int32(p[1] + 1)}
		},
	}
	e.checks = append([]examCheck{
		{"state.booked", "each order fulfilled at the deadline that had no shipment at the start has one, created by the attempt", verdictOnBooked},
		{"state.only_fulfilled", "no shipment created for an order that was not fulfilled when it was created", verdictOnOnlyFulfilled},
		{"state.in_time", "each shipment created within 3 s (times the scale) of its order's being both imported and fulfilled (or of the start)", verdictOnInTime},
	}, append(findingChecks(), completeCheck)...)
	return e
}

// worldOf is the exam's world of variant v: variant 0 as written; any other drawn from v
// alone (a generator of the standard library seeded with it and the exam's name and
// revision), so that the same exam, revision, variant and scale make the same world. A drawn
// world renames every order, shipment, reference and tracking number (never those of
// variant 0; a number two shipments share stays shared), moves every instant after the
// start by -1, 0 or +1 s (each order's and each shipment's in their order, from +1 s to
// +10 s) and every instant before it by -5 to +5 whole minutes (still before it), draws
// each order's platform, and what the exam's vary draws; the traps stay.
func (e *examDef) worldOf(v int64) *examWorld {
	w := e.world.clone()
	if v == 0 {
		return w
	}
	seed := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", e.name, e.revision)))
	r := mrand.New(mrand.NewPCG(uint64(v), binary.BigEndian.Uint64(seed[:8])))
	if e.vary != nil {
		e.vary(w, r)
	}
	names := newNameDrawer(r, &e.world)
	renamed := map[string]string{}
	for i := range w.orders {
		o := &w.orders[i]
		renamed[o.id] = names.draw("ord_exam_", 8, lowerDigits)
		o.id, o.reference = renamed[o.id], prefixOf(o.reference)+names.digits(4)
		o.platform = platforms[r.IntN(len(platforms))]
		o.created, o.imported, o.changes = moveOrder(r, o.created, o.imported, o.changes)
	}
	numbers := map[string]string{}
	number := func(n string) string {
		if numbers[n] == "" {
			numbers[n] = names.draw(n[:3], 10, "0123456789")
		}
		return numbers[n]
	}
	for i := range w.shipments {
		sh := &w.shipments[i]
		sh.id, sh.reference, sh.number = names.draw("shp_exam_", 8, lowerDigits), prefixOf(sh.reference)+names.digits(4), number(sh.number)
		sh.parcels = slices.Clone(sh.parcels)
		for k, p := range sh.parcels {
			sh.parcels[k] = number(p)
		}
		if sh.orderID != "" {
			sh.orderID = renamed[sh.orderID]
		}
		sh.created, sh.events = moveShipment(r, sh.created, sh.events)
	}
	return w
}

// clone is a copy of w that a variant may change without changing w.
func (w *examWorld) clone() *examWorld {
	c := &examWorld{orders: slices.Clone(w.orders), shipments: slices.Clone(w.shipments), given: slices.Clone(w.given), unconfirmed: w.unconfirmed}
	for i := range c.orders {
		c.orders[i].changes = slices.Clone(c.orders[i].changes)
	}
	for i := range c.shipments {
		c.shipments[i].events = slices.Clone(c.shipments[i].events)
	}
	return c
}

const lowerDigits = "abcdefghijklmnopqrstuvwxyz0123456789"

// nameDrawer draws names, each unlike every name it drew and every name of variant 0.
type nameDrawer struct {
	r     *mrand.Rand
	taken map[string]bool
}

func newNameDrawer(r *mrand.Rand, written *examWorld) *nameDrawer {
	n := &nameDrawer{r: r, taken: map[string]bool{}}
	for _, o := range written.orders {
		n.taken[o.id] = true
	}
	for _, s := range written.shipments {
		n.taken[s.id], n.taken[s.number] = true, true
		for _, p := range s.parcels {
			n.taken[p] = true
		}
	}
	return n
}

// draw is prefix and n characters of alphabet, unlike any name drawn or written.
func (n *nameDrawer) draw(prefix string, length int, alphabet string) string {
	for {
		b := []byte(prefix)
		for range length {
			b = append(b, alphabet[n.r.IntN(len(alphabet))])
		}
		if name := string(b); !n.taken[name] {
			n.taken[name] = true
			return name
		}
	}
}

// digits is n decimal digits (a reference's end: references may repeat across variants).
func (n *nameDrawer) digits(length int) string {
	b := make([]byte, length)
	for i := range b {
		b[i] = byte('0' + n.r.IntN(10))
	}
	return string(b)
}

// prefixOf is a reference without its last run of digits: EX-REF-1 is EX-REF-.
func prefixOf(ref string) string { return strings.TrimRight(ref, "0123456789") }

// earliestMoved and latestMoved bound a drawn instant after the start.
const (
	earliestMoved = time.Second
	latestMoved   = 10 * time.Second
)

// moveOrder moves an order's instants: its creation, its import and its changes, in order
// (an import at or after the creation, each change strictly after the one before and the
// creation).
func moveOrder(r *mrand.Rand, created time.Duration, imported *time.Duration, changes []examChange) (time.Duration, *time.Duration, []examChange) {
	for range 100 { // a draw that cannot keep the order is drawn again
		c, ok := moved(r, created, math.MinInt64, false)
		floor, im := c, (*time.Duration)(nil)
		if imported != nil && ok {
			var m time.Duration
			m, ok = moved(r, *imported, c, true)
			im = &m
		}
		var next []examChange
		for _, ch := range changes {
			if !ok {
				break
			}
			var m time.Duration
			m, ok = moved(r, ch.at, floor, false)
			floor, next = m, append(next, examChange{ch.status, m})
		}
		if ok {
			return c, im, next
		}
	}
	return created, imported, changes
}

// moveShipment moves a shipment's creation and its events, each event at or after its
// creation and after the event before it.
func moveShipment(r *mrand.Rand, created *time.Duration, events []examEvent) (*time.Duration, []examEvent) {
	for range 100 {
		floor, ok, c := time.Duration(math.MinInt64), true, (*time.Duration)(nil)
		if created != nil {
			var m time.Duration
			m, ok = moved(r, *created, floor, true)
			floor, c = m, &m
		}
		next := slices.Clone(events)
		for i := range next {
			if !ok {
				break
			}
			next[i].after, ok = moved(r, next[i].after, floor, i == 0 && created != nil)
			floor = next[i].after
		}
		if ok {
			return c, next
		}
	}
	return created, events
}

// moved is d moved: after the start by -1, 0 or +1 s within earliestMoved..latestMoved;
// before it by -5 to +5 whole minutes, still before it; after floor (at it, when atFloor).
func moved(r *mrand.Rand, d, floor time.Duration, atFloor bool) (time.Duration, bool) {
	var m time.Duration
	if d > 0 {
		m = min(latestMoved, max(earliestMoved, d+time.Duration(r.IntN(3)-1)*time.Second))
	} else {
		m = d + time.Duration(r.IntN(11)-5)*time.Minute
		if m >= 0 {
			m = d
		}
	}
	return m, m > floor || atFloor && m == floor
}

// givenJSON is what the task gives in this world: its consignments, each by its shipment's id
// and the number given, in the world's order; {} for an exam that gives none.
func (w *examWorld) givenJSON() json.RawMessage {
	if len(w.given) == 0 {
		return json.RawMessage(`{}`)
	}
	type consignment struct {
		ShipmentID     string `json:"shipment_id"`
		TrackingNumber string `json:"tracking_number"`
	}
	var given struct {
		Consignments []consignment `json:"consignments"`
	}
	for _, c := range w.given {
		sh := w.shipments[c.shipment]
		number := sh.number
		if c.parcel >= 0 {
			number = sh.parcels[c.parcel]
		}
		given.Consignments = append(given.Consignments, consignment{sh.id, number})
	}
	b, _ := marshalJSON(given)
	return b
}

// givenShipments are the shipment ids the task gives, in its order.
func (w *examWorld) givenShipments() []string {
	var ids []string
	for _, c := range w.given {
		ids = append(ids, w.shipments[c.shipment].id)
	}
	return ids
}

// relative writes d as a relative instant of a dataset: start, start+90s, start-10m0s.
func relative(d time.Duration) string {
	switch {
	case d > 0:
		return "start+" + d.String()
	case d < 0:
		return "start-" + (-d).String()
	}
	return "start"
}

// examRecords is an exam's world as a sandbox's body sends it: the records a sandbox of
// records reads (readRecords), so an attempt is made as any sandbox is.
type examRecords struct {
	Orders    []examOrderRecord    `json:"orders"`
	Shipments []examShipmentRecord `json:"shipments"`
}

type examOrderRecord struct {
	ID                string             `json:"id"`
	MerchantReference string             `json:"merchant_reference"`
	Platform          string             `json:"platform"`
	Status            string             `json:"status"`
	CreatedAt         string             `json:"created_at"`
	ImportedAt        *string            `json:"imported_at,omitempty"`
	Changes           []examChangeRecord `json:"changes,omitempty"`
}

type examChangeRecord struct {
	Status string `json:"status"`
	At     string `json:"at"`
}

type examShipmentRecord struct {
	ID                    string            `json:"id"`
	Reference             string            `json:"reference"`
	TrackingNumber        string            `json:"tracking_number"`
	ParcelTrackingNumbers []string          `json:"parcel_tracking_numbers,omitempty"`
	OrderID               *string           `json:"order_id,omitempty"`
	CreatedAt             *string           `json:"created_at,omitempty"`
	Events                []examEventRecord `json:"events"`
}

type examEventRecord struct {
	Status      string `json:"status"`
	Description string `json:"description"`
	Location    string `json:"location"`
	After       string `json:"after"`
}

// records is the world as a sandbox's body sends it, every instant times scale.
func (w *examWorld) records(scale int) []byte {
	s := time.Duration(scale)
	body := examRecords{Orders: []examOrderRecord{}, Shipments: []examShipmentRecord{}}
	for _, o := range w.orders {
		r := examOrderRecord{ID: o.id, MerchantReference: o.reference, Platform: o.platform, Status: o.status, CreatedAt: relative(o.created * s)}
		if o.imported != nil {
			imported := relative(*o.imported * s)
			r.ImportedAt = &imported
		}
		for _, c := range o.changes {
			r.Changes = append(r.Changes, examChangeRecord{c.status, relative(c.at * s)})
		}
		body.Orders = append(body.Orders, r)
	}
	for _, sh := range w.shipments {
		r := examShipmentRecord{ID: sh.id, Reference: sh.reference, TrackingNumber: sh.number, ParcelTrackingNumbers: sh.parcels, Events: []examEventRecord{}}
		if sh.created != nil {
			created := relative(*sh.created * s)
			r.CreatedAt = &created
		}
		if sh.orderID != "" {
			r.OrderID = &sh.orderID
		}
		for _, ev := range sh.events {
			r.Events = append(r.Events, examEventRecord{ev.status, ev.description, ev.where, (ev.after * s).String()})
		}
		body.Shipments = append(body.Shipments, r)
	}
	b, _ := marshalJSON(body)
	return b
}

// examListing is an exam as GET /v1/test_helpers/exams lists it, its members in this order.
type examListing struct {
	Name            string            `json:"name"`
	Revision        int               `json:"revision"`
	Title           string            `json:"title"`
	Task            string            `json:"task"`
	DurationSeconds int               `json:"duration_seconds"`
	Answer          bool              `json:"answer"`
	Given           json.RawMessage   `json:"given"`
	Checks          []examCheckListed `json:"checks"`
}

type examCheckListed struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

// examListings is GET /v1/test_helpers/exams's answer: the catalogue, in its order.
func examListings() ([]byte, error) {
	var list struct {
		Data []examListing `json:"data"`
	}
	for _, e := range examCatalogue {
		l := examListing{Name: e.name, Revision: e.revision, Title: e.title, Task: e.task, DurationSeconds: int(examDuration / time.Second), Answer: e.answer != "", Given: e.world.givenJSON()}
		for _, c := range e.checks {
			l.Checks = append(l.Checks, examCheckListed{c.id, c.title})
		}
		list.Data = append(list.Data, l)
	}
	return marshalJSON(list)
}

// ===== Exams: an attempt, and its grade =====

// An attempt is a sandbox made from an exam's world, with one key of both scopes limited to
// examRate requests a second; its clock stands at its start until the key's first request to
// a route other than the exam routes (or examClockWait after its creation), then runs, and
// cannot be moved. Its journal keeps every entry (its first maxExamEntries) until its grade
// is computed, whatever -journal. The grade is computed once, at its grading instant, from
// the world at the deadline, the answer, and the entries that came before that instant.

const (
	maxExamScale   = 60
	examClockWait  = 60 * time.Second // not times the scale: an attempt that sends nothing still ends
	examRate       = 10
	maxExamEntries = 20000
)

// examAttempt is what a tenant made for an exam keeps of it: the exam, its scale, its start
// and deadline (on its own clock), the key that made it and its own, the world as made (what
// it schedules), the creations of a shipment done (the booking's 502s), and its grade, nil
// until computed, under mu.
type examAttempt struct {
	id              string
	def             *examDef
	variant         int64
	drawn           *examWorld // the world of its variant, as its records were made from it
	kept            int        // the first entries its journal keeps
	scale           int
	start, deadline time.Time
	maker, key      *apiKey
	world           *tenantData
	created         atomic.Int32
	mu              sync.Mutex // after the registry's, before its tenant's (see tenant)
	grade           *examGrade
	answering       int         // under mu: answers in flight that arrived in time, which a read waits for
	graded          atomic.Bool // grade is set: the registry forgets a graded attempt before one that runs
}

// booked counts a creation for an order that passed every check (under its tenant's writing
// lock) and says what the script makes of it: of the first four, the world's two answered
// 502, one done and one not.
func (a *examAttempt) booked() bookingScript {
	switch a.created.Add(1) {
	case a.drawn.unconfirmed[0]:
		return bookingDone
	case a.drawn.unconfirmed[1]:
		return bookingNotDone
	}
	return bookingConfirmed
}

// window is the attempt's 3 s, times its scale.
func (a *examAttempt) window() time.Duration { return examWindow * time.Duration(a.scale) }

// lastAnswer is the last instant an answer is taken: the grade is computed then without one.
func (a *examAttempt) lastAnswer() time.Time {
	if a.def.answer == "" {
		return a.deadline
	}
	return a.deadline.Add(examAnswerTime * time.Duration(a.scale))
}

// gradedBy reports whether the attempt t is graded at the wall clock's now: its grade
// computed, or its grading limit passed on its clock (its grade is computed at the next read).
func (a *examAttempt) gradedBy(t *tenant, now time.Time) bool {
	return a.graded.Load() || !t.clock.read(func() time.Time { return now }).now.Before(a.lastAnswer())
}

// untilGraded is how long after the wall clock's now the attempt t reaches its grading limit:
// what is left of it on its clock, and while its clock stands, until it runs.
func (a *examAttempt) untilGraded(t *tenant, now time.Time) time.Duration {
	wall := func() time.Time { return now }
	left := max(0, a.lastAnswer().Sub(t.clock.read(wall).now))
	if set := t.clock.setting.Load(); set != nil && set.waits && now.Before(set.since) {
		left += set.since.Sub(now)
	}
	return left
}

// rules are what the attempt's tenant is allowed and how what it remembers is kept: found by
// the attempt's id, its maker's to count, its journal kept whole (its first maxExamEntries),
// its clock not to be moved, no fault, the booking's script, and held until it is graded.
func (a *examAttempt) rules() tenantRules {
	return tenantRules{name: a.id, maker: a.maker, keepFirst: a.kept, clockFixed: errExamClock, noFaults: true, script: a, hold: a}
}

// done, doneAt and left are the attempt's hold: until it is graded.
func (a *examAttempt) done() bool                                  { return a.graded.Load() }
func (a *examAttempt) doneAt(t *tenant, now time.Time) bool        { return a.gradedBy(t, now) }
func (a *examAttempt) left(t *tenant, now time.Time) time.Duration { return a.untilGraded(t, now) }

var (
	errExamClock    = &apiError{code: codeCapabilityUnavailable, detail: "An exam's clock runs by itself, from the first request of its key: it cannot be set, nor a request judged at an instant of its own (Prefer: clock)."}
	errExamBody     = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, such as {"exam":"order-sync"}, with optional revision and scale.`}
	errExamUnknown  = &apiError{code: codeNotFound, detail: "No exam attempt of this id is held for this key: an attempt is read with its own key or the key that started it, and is forgotten with its sandbox."}
	errExamNoAnswer = &apiError{code: codeCapabilityUnavailable, detail: "This exam takes no answer: it is graded from its world at the deadline."}
	errExamGraded   = &apiError{code: codeExamGraded, detail: "This attempt is graded already (by an answer, or without one 60 s after its deadline, times its scale): read its grade with GET /v1/test_helpers/exams/{id}."}
)

// examRequest is the body of POST /v1/test_helpers/exams: the exam, its revision (-1: not
// given), the scale and the variant (-1: not given, drawn).
type examRequest struct {
	def             *examDef
	revision, scale int
	variant         int64
}

// examRequestShape is the members of the body, each read as it comes; exam is judged
// against the catalogue then, revision once the body is read (against the exam's).
var examRequestShape = shapeOf(
	member[examRequest]{"exam", func(d *jsonReader, path, name string, req *examRequest) error {
		v, err := d.str(path, name)
		if req.def = examNamed(v); err != nil || req.def == nil {
			return paramError(codeInvalidParameter, "exam", "exam names an exam of the catalogue: "+examNames()+".")
		}
		return nil
	}},
	member[examRequest]{"revision", func(d *jsonReader, path, name string, req *examRequest) (err error) {
		if req.revision, err = d.whole(path, name, math.MaxInt32); err != nil {
			return paramError(codeInvalidParameter, "revision", "revision is a whole number: the exam's revision this sandbox serves (GET /v1/test_helpers/exams).")
		}
		return nil
	}},
	member[examRequest]{"scale", func(d *jsonReader, path, name string, req *examRequest) (err error) {
		if req.scale, err = d.whole(path, name, maxExamScale); err != nil || req.scale < 1 {
			return paramError(codeInvalidParameter, "scale", fmt.Sprintf("scale is a whole number from 1 to %d: every instant of the exam's world, its duration and its windows times it, for a client that works slowly.", maxExamScale))
		}
		return nil
	}},
	member[examRequest]{"variant", func(d *jsonReader, path, name string, req *examRequest) error {
		v, err := d.whole(path, name, maxVariant)
		if err != nil {
			return paramError(codeInvalidParameter, "variant", fmt.Sprintf("variant is a whole number from 0 to %d: the world drawn for the attempt (0: the one the reference describes; absent: drawn at random), to take a failing attempt's world again.", maxVariant))
		}
		req.variant = int64(v)
		return nil
	}},
)

// readExamRequest reads the body as a sandbox's is read: its JSON syntax first (400), then
// its members in the order sent, each by its name, then given again, then its value (422);
// then the exam (required) and its revision (the one served).
func readExamRequest(b []byte) (examRequest, error) {
	req := examRequest{scale: 1, revision: -1, variant: -1}
	if !oneJSONObject(b) {
		return req, errExamBody
	}
	d := newJSONReader(bytes.NewReader(b), maxBodyBytes)
	if err := d.document(examRequestShape.names, func(name string) error { return examRequestShape.member(d, "$", name, &req) }); err != nil {
		return req, bodyFault(err)
	}
	if req.def == nil {
		return req, paramError(codeInvalidParameter, "exam", "exam names an exam of the catalogue: "+examNames()+" (GET /v1/test_helpers/exams lists them).")
	}
	if req.revision >= 0 && req.revision != req.def.revision {
		return req, paramError(codeInvalidParameter, "revision", fmt.Sprintf("This sandbox serves revision %d of %s.", req.def.revision, req.def.name))
	}
	return req, nil
}

// examNames lists the catalogue's exams, for a message.
func examNames() string {
	var names []string
	for _, e := range examCatalogue {
		names = append(names, e.name)
	}
	return strings.Join(names, ", ")
}

// examStarted is POST /v1/test_helpers/exams's answer, its members in this order.
type examStarted struct {
	ID        string          `json:"id"`
	Exam      string          `json:"exam"`
	Revision  int             `json:"revision"`
	Variant   int64           `json:"variant"`
	Scale     int             `json:"scale"`
	Account   string          `json:"account"`
	Key       string          `json:"key"`
	StartedAt string          `json:"started_at"`
	Deadline  string          `json:"deadline"`
	Task      string          `json:"task"`
	Given     json.RawMessage `json:"given"`
}

// newAttempt makes an attempt of the exam the body asks for, for the caller's key, at the
// wall clock's now: a sandbox of the exam's world, its one key, its clock standing at its
// start; kept in the registry beside the sandboxes. It returns the answer, and the attempt's
// id.
func (b *tenantRegistry) newAttempt(body []byte, caller *apiKey, now time.Time) ([]byte, string, error) {
	req, err := readExamRequest(body)
	if err != nil {
		return nil, "", err
	}
	start := now.UTC().Truncate(time.Second)
	t := newTenant(tenantID{"acct_" + randomText(20), "test"}, start)
	if req.variant < 0 {
		req.variant = 1 + mrand.Int64N(maxVariant)
	}
	a, err := req.def.attemptOf("exm_"+randomText(20), req.variant, req.scale, start, t.id)
	if err != nil {
		return nil, "", err
	}
	key, out, _ := sandboxKey("$.keys[0]", keyRecord{Scopes: scopeNames}, t)
	key.limit = newRateLimit(examRate, now)
	a.kept, a.maker, a.key = b.examEntries, caller, key
	d := a.world
	t.data.Store(d)
	t.sandbox, t.exam, t.rules = &sandboxAccount{}, a, a.rules()
	t.clock.setting.Store(&clockSetting{at: start, running: true, waits: true, since: now.Add(examClockWait)})
	keys := map[[sha256.Size]byte]*apiKey{sha256.Sum256([]byte(out.Key)): key}
	if err := b.add(t, caller.tenant, keys, d.bytes()+int64(unsafe.Sizeof(tenant{})+unsafe.Sizeof(examAttempt{})), now); err != nil {
		return nil, "", err
	}
	answer, err := marshalJSON(examStarted{ID: a.id, Exam: req.def.name, Revision: req.def.revision, Variant: a.variant, Scale: req.scale, Account: t.id.account, Key: out.Key,
		StartedAt: formatTimestamp(start), Deadline: formatTimestamp(a.deadline), Task: req.def.task, Given: a.drawn.givenJSON()})
	return answer, a.id, err
}

// attemptOf is an attempt of exam def with this id, variant and scale, started at start in
// the tenant named id: its world drawn and made, its deadline; no key yet. A start makes
// one so, and exam regrade the one a trace names.
func (def *examDef) attemptOf(id string, variant int64, scale int, start time.Time, tenant tenantID) (*examAttempt, error) {
	drawn := def.worldOf(variant)
	world, err := readSandboxRequest(drawn.records(scale), nil)
	var d *tenantData
	if err == nil {
		d, err = buildSandboxData(tenant, start, world.orders, world.shipments, 0, true)
	}
	if err != nil {
		return nil, fmt.Errorf("the exam %s's world: %w", def.name, err) // the catalogue's own: an internal error
	}
	return &examAttempt{id: id, def: def, variant: variant, drawn: drawn, kept: maxExamEntries, scale: scale, start: start, world: d,
		deadline: start.Add(examDuration * time.Duration(scale))}, nil
}

// attempt is the attempt of this id that key may read (its own key, or the key that made
// it), or nil.
func (b *tenantRegistry) attempt(id string, key *apiKey) *tenant {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.named[id]
	if t == nil || t.gone.Load() || key != t.exam.key && key != t.exam.maker {
		return nil
	}
	return t
}

// gradeRead is GET /v1/test_helpers/exams/{id}'s answer for key: the grade of the attempt of
// this id as its clock shows it at the wall clock's now (pending until its grading instant),
// as JSON or JUnit, and its content type; 404 for an attempt key may not read.
func (b *tenantRegistry) gradeRead(id string, key *apiKey, wall func() time.Time, junit bool) ([]byte, string, error) {
	t := b.attempt(id, key)
	if t == nil {
		return nil, "", errExamUnknown
	}
	now := t.clock.read(wall).now
	view := t.exam.gradeView(t, t.exam.gradeAt(t, now), now)
	if junit {
		return view.junit(), "application/xml; charset=utf-8", nil
	}
	b2, err := marshalJSON(view)
	return b2, jsonContentType, err
}

// answerAttempt is POST /v1/test_helpers/exams/{id}/answer's answer: the grade of t's
// attempt of this id with the answer body, which arrived at now on its clock, sent with key
// (the attempt's own); or why not, in the contract's order: the attempt (404), the body (400,
// 422), an exam without an answer (422), before the deadline (409 exam_running), graded
// already (409 exam_graded).
func (t *tenant) answerAttempt(id string, key *apiKey, body []byte, now time.Time) ([]byte, error) {
	a := t.exam
	if a == nil || a.id != id || a.key != key {
		return nil, errExamUnknown
	}
	answer, err := readExamAnswer(body, a.def)
	switch {
	case err != nil:
		return nil, err
	case a.def.answer == "":
		return nil, errExamNoAnswer
	}
	grade, fault := a.answered(t, answer, now)
	if fault != nil {
		return nil, fault
	}
	if t.gone.Load() { // forgotten while it was graded: its grade is no one's to read
		return nil, errForgotten
	}
	return marshalJSON(a.gradeView(t, grade, now))
}

// answerArrived notes an answer to t's attempt that arrived at now on its clock, when that is
// before its last allowed instant: until the function it returns is called, no read computes
// the grade without it. nil when there is no attempt, or the answer is late.
func (t *tenant) answerArrived(now time.Time) func() {
	if a := t.exam; a != nil && a.admit(now) {
		return a.release
	}
	return nil
}

// examAnswer is an attempt's answer as read: its items (orders, or consignments), and
// whether the body held its list.
type examAnswer struct {
	items []answerItem
	sent  bool
	raw   []byte // the body as received
}

// answerItem is an item of an answer: its id (an order's, or a consignment's shipment), its
// status, and an order's shipment_id ("" for null); each member given as its bit.
type answerItem struct {
	id, status, shipmentID string
	linked                 bool // shipment_id is not null
	given                  uint8
}

// The shapes of an answer: the member each exam answers with, and each's items, every
// member required, a status of its vocabulary. An id the world does not hold, or one given
// twice, is graded, not refused.
var (
	orderItemShape = shapeOf(
		answerText("id", 1, func(it *answerItem, v string) { it.id = v }),
		answerStatus(2, orderStatuses),
		member[answerItem]{"shipment_id", func(d *jsonReader, path, name string, it *answerItem) error {
			v, err := d.optStr(path, name)
			if v != nil {
				it.shipmentID, it.linked = *v, true
			}
			it.given |= 4
			return err
		}},
	)
	consignmentItemShape = shapeOf(answerText("shipment_id", 1, func(it *answerItem, v string) { it.id = v }), answerStatus(2, trackingStatuses))
	answerShapes         = map[string]*recordShape[answerItem]{"orders": &orderItemShape, "consignments": &consignmentItemShape}
)

// answerText is a required string member of an item: null is refused.
func answerText(name string, bit uint8, set func(*answerItem, string)) member[answerItem] {
	return member[answerItem]{name, func(d *jsonReader, path, name string, it *answerItem) error {
		v, err := d.optStr(path, name)
		if err == nil && v == nil {
			err = paramError(codeInvalidParameter, answerParam(path, name), answerParam(path, name)+" is a string.")
		}
		if v != nil {
			set(it, *v)
		}
		it.given |= bit
		return err
	}}
}

// answerParam is the param that names member name of the item at path.
func answerParam(path, name string) string { return strings.TrimPrefix(memberPath(path, name), "$.") }

// answerStatus is an item's status, one of vocabulary.
func answerStatus(bit uint8, vocabulary []string) member[answerItem] {
	return member[answerItem]{"status", func(d *jsonReader, path, name string, it *answerItem) error {
		v, err := d.optStr(path, name)
		if err == nil && (v == nil || !slices.Contains(vocabulary, *v)) {
			err = paramError(codeInvalidParameter, answerParam(path, name), answerParam(path, name)+" is one of "+strings.Join(vocabulary, ", ")+".")
		}
		if err == nil {
			it.status = *v
		}
		it.given |= bit
		return err
	}}
}

// readExamAnswer reads an answer's body for exam e as a sandbox's body is read: one JSON
// object (400), its member (the exam's: orders or consignments; for an exam without an
// answer, either), a list of items, each with every member of its shape (422, named by its
// JSON path).
func readExamAnswer(b []byte, e *examDef) (*examAnswer, error) {
	if !oneJSONObject(b) {
		return nil, &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, such as {"orders":[{"id":"ord_exam_0001","status":"fulfilled","shipment_id":"shp_exam_1"}]}.`}
	}
	names := []string{"orders", "consignments"}
	if e.answer != "" {
		names = []string{e.answer}
	}
	ans := &examAnswer{raw: b}
	d := newJSONReader(bytes.NewReader(b), maxBodyBytes)
	err := d.document(names, func(name string) error {
		ans.sent = true
		shape := answerShapes[name]
		if c, err := d.next(); err == nil && c == 'n' { // a list is required, not none
			return paramError(codeInvalidParameter, name, name+" is a list of objects, each "+strings.Join(shape.names, ", ")+".")
		}
		return d.array("$."+name, func(i int) error {
			var it answerItem
			path := fmt.Sprintf("$.%s[%d]", name, i)
			if c, err := d.next(); err == nil && c == 'n' {
				return paramError(codeInvalidParameter, path[2:], path[2:]+" is an object: "+strings.Join(shape.names, ", ")+".")
			}
			err := shape.read(d, path, &it)
			for bit, member := range shape.names {
				if err == nil && it.given&(1<<bit) == 0 {
					err = paramError(codeInvalidParameter, answerParam(path, member), answerParam(path, member)+" is required.")
				}
			}
			ans.items = append(ans.items, it)
			return err
		})
	})
	switch {
	case err != nil:
		return nil, bodyFault(err)
	case !ans.sent && e.answer != "":
		return nil, paramError(codeInvalidParameter, e.answer, e.answer+" is required: the list of what the task asks for.")
	}
	return ans, nil
}

// examGrade is an attempt's grade, computed once: its instant and its checks' verdicts.
type examGrade struct {
	gradedAt time.Time
	verdicts []checkVerdict
	answer   []byte // the answer's body as received; nil for none
	lost     uint64 // the entries its journal had not kept when it was computed
}

// checkVerdict is what a check found: a failure's detail ("" for a pass) and the journal's
// seqs it cites.
type checkVerdict struct {
	detail   string
	requests []uint64
	margin   *int64 // a timed check's window less the longest delay it judged, in ms; nil for none
}

func pass() checkVerdict { return checkVerdict{} }

func failed(detail string, seqs ...uint64) checkVerdict {
	return checkVerdict{detail: detail, requests: seqs}
}

// grading is what a grade judges: the attempt, its data, the entries of its journal that
// arrived before the grading instant, and its answer (nil: none).
type grading struct {
	a       *examAttempt
	d       *tenantData
	entries []journalEntry
	lost    uint64
	answer  *examAnswer
	found   []rawFinding
}

// gradeOf computes the grade of the attempt t at its grading instant at, with answer (nil:
// none): a function of its data, the entries of its journal judged before at, its answer,
// and how many entries its journal lost by the time it is computed (which may count entries
// that came after at: a flood's losses are its own evidence).
func gradeOf(t *tenant, at time.Time, answer *examAnswer) *examGrade {
	part := t.journalPart(journalRead{})                                        // a copy of its own: filtered in place
	return t.exam.judge(t.current(), part.entries, t.journalLost(), at, answer) // every entry it did not keep, those a read counts as dropped included
}

// judge is the attempt's grade at its grading instant at: a function of its data d, its
// journal's entries es (oldest first; those judged before at are kept, in place), how many
// entries it lost, and its answer (nil: none). The server judges an attempt so, and exam
// regrade a trace of one.
func (a *examAttempt) judge(d *tenantData, es []journalEntry, lost uint64, at time.Time, answer *examAnswer) *examGrade {
	g := &grading{a: a, d: d, answer: answer, lost: lost, entries: es[:0]}
	for _, e := range es {
		if instantOf(at).after(e.clock) {
			g.entries = append(g.entries, e)
		}
	}
	g.found = g.d.rawFindings(g.entries)
	grade := &examGrade{gradedAt: at, lost: lost}
	if answer != nil {
		grade.answer = answer.raw
	}
	for _, c := range a.def.checks {
		grade.verdicts = append(grade.verdicts, c.verdict(g))
	}
	return grade
}

// gradeAt is the attempt's grade, computed once its grading instant has passed at now on its
// clock (the last instant an answer is taken; the deadline, for an exam without an answer),
// or nil while it runs.
func (a *examAttempt) gradeAt(t *tenant, now time.Time) *examGrade {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.grade == nil && !now.Before(a.lastAnswer()) && a.answering == 0 {
		a.grade = gradeOf(t, a.lastAnswer(), nil)
		a.graded.Store(true)
	}
	return a.grade
}

// admit notes an answer in flight that arrived at now on the attempt's clock, when that is
// before its last allowed instant and it is not graded: until release, no read computes the
// grade without it. It reports whether it noted it.
func (a *examAttempt) admit(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.grade != nil || !now.Before(a.lastAnswer()) {
		return false
	}
	a.answering++
	return true
}

func (a *examAttempt) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answering--
}

// answered grades the attempt with its answer, which arrived at now on its clock: 409 while
// it runs (with the seconds until its deadline, rounded up) or once it is graded (one of two
// answers in flight is graded, the other refused).
func (a *examAttempt) answered(t *tenant, answer *examAnswer, now time.Time) (*examGrade, *apiError) {
	if now.Before(a.deadline) {
		wait := int((a.deadline.Sub(now) + time.Second - 1) / time.Second)
		return nil, &apiError{code: codeExamRunning, retryAfter: wait, detail: fmt.Sprintf("This attempt runs until its deadline, %s on its clock (now %s): answer once it has passed, in %d s (Retry-After), and within %v of it.",
			formatTimestamp(a.deadline), formatTimestamp(now), wait, examAnswerTime*time.Duration(a.scale))}
	}
	if a.gradeAt(t, now) != nil {
		return nil, errExamGraded
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.grade != nil {
		return nil, errExamGraded
	}
	a.grade = gradeOf(t, now, answer)
	a.graded.Store(true)
	return a.grade, nil
}

// gradeJSON is GET /v1/test_helpers/exams/{id}'s answer, its members in this order.
type gradeJSON struct {
	ID        string      `json:"id"`
	Exam      string      `json:"exam"`
	Revision  int         `json:"revision"`
	Variant   int64       `json:"variant"`
	Scale     int         `json:"scale"`
	Account   string      `json:"account"`
	State     string      `json:"state"`
	StartedAt string      `json:"started_at"`
	Now       string      `json:"now"`
	Deadline  string      `json:"deadline"`
	GradedAt  *string     `json:"graded_at"`
	Passed    *bool       `json:"passed"`
	Score     *string     `json:"score"`
	Checks    []checkJSON `json:"checks"`
}

type checkJSON struct {
	ID       string   `json:"id"`
	Title    string   `json:"title"`
	Result   string   `json:"result"`
	Detail   *string  `json:"detail"`
	Requests []uint64 `json:"requests"`
	MarginMS *int64   `json:"margin_ms"`
}

// gradeView is the grade as a read at now (on the attempt's clock) shows it: pending until
// it is computed.
func (a *examAttempt) gradeView(t *tenant, grade *examGrade, now time.Time) gradeJSON {
	v := gradeJSON{ID: a.id, Exam: a.def.name, Revision: a.def.revision, Variant: a.variant, Scale: a.scale, Account: t.id.account, State: "running",
		StartedAt: formatTimestamp(a.start), Now: formatTimestamp(now), Deadline: formatTimestamp(a.deadline), Checks: []checkJSON{}}
	if !now.Before(a.deadline) {
		v.State = "awaiting_answer"
	}
	passes := 0
	for i, c := range a.def.checks {
		cj := checkJSON{ID: c.id, Title: c.title, Result: "pending", Requests: []uint64{}}
		if grade != nil {
			verdict := grade.verdicts[i]
			cj.Result, cj.Requests, cj.MarginMS = "pass", append(cj.Requests, verdict.requests...), verdict.margin
			if verdict.detail != "" {
				cj.Result, cj.Detail = "fail", &verdict.detail
			} else {
				passes++
			}
		}
		v.Checks = append(v.Checks, cj)
	}
	if grade != nil {
		gradedAt, passed, score := formatTimestamp(grade.gradedAt), passes == len(a.def.checks), fmt.Sprintf("%d/%d", passes, len(a.def.checks))
		v.State, v.GradedAt, v.Passed, v.Score = "graded", &gradedAt, &passed, &score
	}
	return v
}

// junit is the grade as a JUnit report: one test suite, a test case a check, a failure with
// its detail and the journal entries it cites; a pending check an error ("not graded yet"),
// neither passed nor skipped, so that a CI step that reads it early fails.
func (v gradeJSON) junit() []byte {
	suite := junitReport{name: "exam " + v.Exam + " " + v.ID, timestamp: v.StartedAt,
		properties: [][2]string{{"exam", v.Exam}, {"revision", strconv.Itoa(v.Revision)}, {"variant", strconv.FormatInt(v.Variant, 10)}, {"scale", strconv.Itoa(v.Scale)}, {"state", v.State}}}
	if v.GradedAt != nil {
		started, _ := time.Parse(time.RFC3339Nano, v.StartedAt)
		graded, _ := time.Parse(time.RFC3339Nano, *v.GradedAt)
		suite.seconds = graded.Sub(started).Seconds()
	}
	for _, c := range v.Checks {
		jc := junitTest{class: "exam." + v.Exam, name: c.ID, result: c.Result}
		switch c.Result {
		case "fail":
			jc.message, jc.body = *c.Detail, citedEntries(c.Requests)
		case "pending":
			jc.result, jc.message = "error", "not graded yet"
			jc.body = "The attempt's grade is computed at its grading instant (state " + v.State + "): read it again once graded."
		}
		suite.cases = append(suite.cases, jc)
	}
	return suite.xml()
}

// citedEntries says which journal entries a check cites, and where to read them.
func citedEntries(seqs []uint64) string {
	if len(seqs) == 0 {
		return "No journal entry cited."
	}
	return "J" + entriesCited(seqs)[1:] + " (GET /v1/test_helpers/requests with the attempt's key)."
}

// The checks' verdicts, each a function of the grading.

// noAnswer is the detail of an answer check without an answer.
func noAnswer(a *examAttempt) string {
	return fmt.Sprintf("No answer: answer with POST /v1/test_helpers/exams/%s/answer once the deadline (%s on the attempt's clock) has passed, within %v of it.", a.id, formatTimestamp(a.deadline), examAnswerTime*time.Duration(a.scale))
}

// orderAt is what the order id shows at at: its status and shipment_id (nil: null), or false
// when it is not shown then.
func orderAt(d *tenantData, id string, at time.Time) (string, *string, bool) {
	b, _, err := d.orders.get(id, at)
	var o struct {
		Status     string  `json:"status"`
		ShipmentID *string `json:"shipment_id"`
	}
	if err != nil || json.Unmarshal(b, &o) != nil {
		return "", nil, false
	}
	return o.Status, o.ShipmentID, true
}

// firstFive names at most five of ids, and how many more there are.
func firstFive(ids []string) string {
	s := strings.Join(ids[:min(5, len(ids))], ", ")
	if len(ids) > 5 {
		s += fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return s
}

// answerDiff is what an answer's items miss of want, hold beyond it, and hold twice.
func answerDiff(items []answerItem, want []string) (missing, extra, twice []string) {
	count := map[string]int{}
	for _, item := range items {
		if count[item.id]++; count[item.id] == 2 {
			twice = append(twice, item.id)
		}
		if count[item.id] == 1 && !slices.Contains(want, item.id) {
			extra = append(extra, item.id)
		}
	}
	for _, id := range want {
		if count[id] == 0 {
			missing = append(missing, id)
		}
	}
	return missing, extra, twice
}

// diffDetail says what an answer missed (one or many of what), held beyond what it should,
// and held twice, or "".
func diffDetail(missing, extra, twice []string, one, many, advice string) string {
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("lacks %d %s (%s)", len(missing), plural(len(missing), one, many), firstFive(missing)))
	}
	if len(extra) > 0 {
		parts = append(parts, fmt.Sprintf("holds %d that it should not (%s)", len(extra), firstFive(extra)))
	}
	if len(twice) > 0 {
		parts = append(parts, fmt.Sprintf("holds %d more than once (%s)", len(twice), firstFive(twice)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "The answer " + strings.Join(parts, ", ") + ": " + advice
}

func verdictOnAnswerOrders(g *grading) checkVerdict {
	if g.answer == nil {
		return failed(noAnswer(g.a))
	}
	shown, _ := g.d.orders.firstListed(g.a.deadline, math.MaxInt32)
	want := make([]string, len(shown))
	for i, o := range shown {
		want[i] = o.id
	}
	missing, extra, twice := answerDiff(g.answer.items, want)
	return failed(diffDetail(missing, extra, twice, "order the account shows at the deadline", "orders the account shows at the deadline",
		"keep every order you have seen, read the whole list (every page), and re-read a window that looks back further than imports can be late."))
}

// verdictOnAnswered judges each answered item the world shows at the deadline by what is told
// of it (its status, or its shipment_id), listing those unlike the world.
func verdictOnAnswered(g *grading, told func(item answerItem) (answered, actual string, shown bool), one, many, advice string) checkVerdict {
	if g.answer == nil {
		return failed(noAnswer(g.a))
	}
	var wrong []string
	for _, item := range g.answer.items {
		if answered, actual, shown := told(item); shown && answered != actual {
			wrong = append(wrong, fmt.Sprintf("%s answered %s, %s at the deadline", item.id, answered, actual))
		}
	}
	if len(wrong) == 0 {
		return pass()
	}
	return failed(fmt.Sprintf("%d %s unlike the world at the deadline: %s; %s", len(wrong), plural(len(wrong), one, many), firstFive(wrong), advice))
}

func verdictOnAnswerOrderStatuses(g *grading) checkVerdict {
	return verdictOnAnswered(g, func(item answerItem) (string, string, bool) {
		status, _, shown := orderAt(g.d, item.id, g.a.deadline)
		return item.status, status, shown
	}, "order's status answered", "orders' statuses answered", "keep re-reading the orders you hold until the deadline: a status changes after an order is first seen.")
}

func verdictOnAnswerLinks(g *grading) checkVerdict {
	return verdictOnAnswered(g, func(item answerItem) (string, string, bool) {
		_, shipment, shown := orderAt(g.d, item.id, g.a.deadline)
		var answered *string // JSON null; the string "null" is an id the world does not hold
		if item.linked {
			answered = &item.shipmentID
		}
		return linkText(answered), linkText(shipment), shown
	}, "order's shipment_id answered", "orders' shipment_id answered", "keep re-reading the orders you hold: a shipment is linked after an order is first seen.")
}

// linkText writes a shipment_id for a grade's detail: null for JSON null, the id itself,
// or the id quoted where it reads as null ("null").
func linkText(id *string) string {
	switch {
	case id == nil:
		return "null"
	case *id == "null" || *id == "" || strings.TrimSpace(*id) != *id:
		return strconv.Quote(*id)
	}
	return *id
}

func verdictOnAnswerConsignments(g *grading) checkVerdict {
	if g.answer == nil {
		return failed(noAnswer(g.a))
	}
	missing, extra, twice := answerDiff(g.answer.items, g.a.drawn.givenShipments())
	return failed(diffDetail(missing, extra, twice, "consignment given", "consignments given", "answer each consignment given, once, by its shipment id."))
}

func verdictOnAnswerTrackingStatuses(g *grading) checkVerdict {
	return verdictOnAnswered(g, func(item answerItem) (string, string, bool) {
		s := g.d.shipments.find(item.id)
		if s == nil || !s.existsAt(g.a.deadline) || !slices.Contains(g.a.drawn.givenShipments(), item.id) {
			return "", "", false
		}
		return item.status, s.statusAt(g.a.deadline), true
	}, "consignment's status answered", "consignments' statuses answered", "read each consignment by its shipment id (GET /v1/shipments/{id}/tracking), not by a number other shipments or parcels may hold, until the deadline.")
}

// creation is a shipment the attempt created for an order: its instant, and the journal's
// entry of the request that created it (0: none found).
type creation struct {
	orderID, shipmentID string
	at                  time.Time
	seq                 uint64
}

// creations are the shipments the attempt created for orders by its deadline, in the order
// made.
func (g *grading) creations() []creation {
	var made []creation
	for _, l := range g.d.links {
		if l.write == 0 || l.at.after(instantOf(g.a.deadline)) {
			continue
		}
		c := creation{orderID: l.orderID, shipmentID: l.shipmentID, at: l.at.time()}
		for i := range g.entries {
			if e := &g.entries[i]; e.shown.kind == showsWritten && e.shown.ship.id == l.shipmentID && e.routePath == "/v1/test_helpers/shipments" {
				c.seq = e.seq
				break
			}
		}
		made = append(made, c)
	}
	return made
}

// seqsOf are the seqs of the creations' requests.
func seqsOf(cs []creation) []uint64 {
	var seqs []uint64
	for _, c := range cs {
		if c.seq > 0 {
			seqs = append(seqs, c.seq)
		}
	}
	return seqs
}

func verdictOnBooked(g *grading) checkVerdict {
	made := g.creations()
	var unbooked []string
	for _, o := range g.a.drawn.orders {
		status, _, shown := orderAt(g.d, o.id, g.a.deadline)
		_, before, _ := orderAt(g.d, o.id, g.a.start)
		if !shown || status != "fulfilled" || before != nil {
			continue
		}
		if !slices.ContainsFunc(made, func(c creation) bool { return c.orderID == o.id }) {
			unbooked = append(unbooked, o.id)
		}
	}
	if len(made) == 0 && len(unbooked) > 0 {
		return failed(fmt.Sprintf("No shipment created: %d %s none (%s); book each with POST /v1/test_helpers/shipments and its order_id.", len(unbooked), plural(len(unbooked), "order fulfilled at the deadline has", "orders fulfilled at the deadline have"), firstFive(unbooked)))
	}
	if len(unbooked) > 0 {
		return failed(fmt.Sprintf("%d %s no shipment (%s): poll the orders until the deadline, and book each order once it is fulfilled, those imported late too.", len(unbooked), plural(len(unbooked), "order fulfilled at the deadline has", "orders fulfilled at the deadline have"), firstFive(unbooked)), seqsOf(made)...)
	}
	return checkVerdict{requests: seqsOf(made)}
}

func verdictOnOnlyFulfilled(g *grading) checkVerdict {
	var wrong []creation
	var named []string
	for _, c := range g.creations() {
		if status, _, _ := orderAt(g.d, c.orderID, c.at); status != "fulfilled" {
			wrong, named = append(wrong, c), append(named, fmt.Sprintf("%s for %s (%s then)", c.shipmentID, c.orderID, cmp.Or(status, "not shown")))
		}
	}
	if len(wrong) == 0 {
		return pass()
	}
	return failed(fmt.Sprintf("%d %s for an order that was not fulfilled then: %s; book an order only once its status is fulfilled.", len(wrong), plural(len(wrong), "shipment was created", "shipments were created"), firstFive(named)), seqsOf(wrong)...)
}

// readyAt is when the exam's order o was first both imported and fulfilled, or the start
// when it was so then; false when it never is by the deadline.
func (a *examAttempt) readyAt(o examOrder) (time.Time, bool) {
	s := time.Duration(a.scale)
	imported := a.start.Add(cmp.Or(derefDuration(o.imported), o.created) * s)
	var fulfilled *time.Time
	if o.status == "fulfilled" {
		f := a.start.Add(o.created * s)
		fulfilled = &f
	}
	for _, c := range o.changes {
		if c.status == "fulfilled" && fulfilled == nil {
			f := a.start.Add(c.at * s)
			fulfilled = &f
		}
	}
	if fulfilled == nil {
		return time.Time{}, false
	}
	ready := imported
	if fulfilled.After(ready) {
		ready = *fulfilled
	}
	if ready.Before(a.start) {
		ready = a.start
	}
	return ready, !ready.After(a.deadline)
}

// derefDuration is *d, or 0 for nil.
func derefDuration(d *time.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return *d
}

func verdictOnInTime(g *grading) checkVerdict {
	var late []creation
	var named []string
	judged, longest := false, time.Duration(0)
	for _, c := range g.creations() {
		i := slices.IndexFunc(g.a.drawn.orders, func(o examOrder) bool { return o.id == c.orderID })
		if status, _, _ := orderAt(g.d, c.orderID, c.at); i < 0 || status != "fulfilled" {
			continue // an order never booked is state.booked's to judge, one booked too early state.only_fulfilled's
		}
		ready, ok := g.a.readyAt(g.a.drawn.orders[i])
		if !ok {
			continue
		}
		judged, longest = true, max(longest, c.at.Sub(ready))
		if c.at.Sub(ready) > g.a.window() {
			late, named = append(late, c), append(named, fmt.Sprintf("%s for %s %s after it was ready", c.shipmentID, c.orderID, formatSeconds(int64(c.at.Sub(ready)))))
		}
	}
	margin := marginOf(g.a.window(), longest, !judged)
	if len(late) == 0 {
		return checkVerdict{margin: margin}
	}
	return checkVerdict{margin: margin, requests: seqsOf(late), detail: fmt.Sprintf("%d %s more than %v after its order was both imported and fulfilled: %s; poll the orders at least every %v and book at once.", len(late), plural(len(late), "shipment was created", "shipments were created"), g.a.window(), firstFive(named), g.a.window())}
}

// thing is what an exam's world does after the start: an order imported, its status changed
// or a shipment linked to it; an event of a consignment given.
type thing struct {
	id, what string
	at       time.Time
}

// things are what the attempt's world, as made, does after its start and by its deadline,
// that a client keeping current must show: to the orders (an exam that answers orders), or
// to the consignments given.
func (g *grading) things() []thing {
	var things []thing
	start, deadline := instantOf(g.a.start), instantOf(g.a.deadline)
	given := g.a.drawn.givenShipments()
	for _, h := range g.a.world.timeline {
		at := instantOf(h.at)
		if !at.after(start) || at.after(deadline) {
			continue
		}
		switch {
		case g.a.def.answer == "orders" && (h.kind == orderImported || h.kind == orderChanged):
			things = append(things, thing{h.id, happeningKinds[h.kind] + " (" + h.status + ")", h.at})
		case g.a.def.answer == "orders" && h.kind == shipmentCreated:
			for _, l := range g.a.world.links {
				if l.shipmentID == h.id {
					things = append(things, thing{l.orderID, "link to " + h.id, h.at})
				}
			}
		case g.a.def.answer == "consignments" && h.kind == shipmentEvent && slices.Contains(given, h.id):
			things = append(things, thing{h.id, "event (" + h.status + ")", h.at})
		}
	}
	return things
}

func verdictOnKeptCurrent(g *grading) checkVerdict {
	things := g.things()
	delays := make([]time.Duration, len(things)) // each thing's delay until the first read that showed it; -1: none yet
	pending := map[string][]int{}                // the things not yet shown, by id
	for k, th := range things {
		delays[k], pending[th.id] = -1, append(pending[th.id], k)
	}
	// An attempt's clock only moves on, so its entries come in the order of their instants:
	// the first read at or after a thing that shows it is its delay's end, and once every
	// thing is shown no later entry can change a delay.
	for i := 0; i < len(g.entries) && len(pending) > 0; i++ {
		e := &g.entries[i]
		if !e.read() {
			continue
		}
		for _, id := range g.d.idsOf(e) {
			ks := pending[id]
			ks = slices.DeleteFunc(ks, func(k int) bool {
				if d := e.clock.time().Sub(things[k].at); !instantOf(things[k].at).after(e.clock) {
					delays[k] = d
					return true
				}
				return false
			})
			if len(ks) == 0 {
				delete(pending, id)
			} else if _, ok := pending[id]; ok {
				pending[id] = ks
			}
		}
	}
	var missed []string
	longest, never := time.Duration(0), false
	for k, th := range things {
		never = never || delays[k] < 0
		longest = max(longest, delays[k])
		if delays[k] < 0 || delays[k] > g.a.window() {
			missed = append(missed, fmt.Sprintf("%s %s at %s", th.id, th.what, "+"+th.at.Sub(g.a.start).String()))
		}
	}
	margin := marginOf(g.a.window(), longest, never || len(things) == 0)
	if len(missed) == 0 {
		return checkVerdict{margin: margin}
	}
	return checkVerdict{margin: margin, detail: fmt.Sprintf("%d %s not shown by a read within %v: %s; read what you follow at least every %v until the deadline, not once at the end.", len(missed), plural(len(missed), "thing the world did was", "things the world did were"), g.a.window(), firstFive(missed), g.a.window())}
}

// marginOf is a timed check's margin: its window less the longest delay it judged, in whole
// milliseconds rounded down (negative when a delay failed it); nil when a delay has no end
// (a thing never shown or booked) or none was judged.
func marginOf(window, longest time.Duration, none bool) *int64 {
	if none {
		return nil
	}
	ms := (window - longest).Milliseconds()
	if (window-longest)%time.Millisecond < 0 {
		ms--
	}
	return &ms
}

// verdictOnFindings judges one finding code: failed by any finding of it, its detail the first's
// (and how many more), citing every such finding's requests.
func verdictOnFindings(code findingCode) func(g *grading) checkVerdict {
	return func(g *grading) checkVerdict {
		var of []rawFinding
		for _, f := range g.found {
			if f.kind == code {
				of = append(of, f)
			}
		}
		if len(of) == 0 {
			return pass()
		}
		detail := g.d.written(g.entries, &of[0]).Detail
		if len(of) > 1 {
			detail = strings.TrimSuffix(detail, ".") + fmt.Sprintf(" (and %d more).", len(of)-1)
		}
		var seqs []uint64
		for _, f := range of {
			for _, i := range f.cited {
				if i >= 0 && !slices.Contains(seqs, g.entries[i].seq) {
					seqs = append(seqs, g.entries[i].seq)
				}
			}
		}
		return failed(detail, seqs...)
	}
}

// writeRoutes are the routes whose requests write: the sandboxes made and forgotten, the
// shipments created and moved.
var writeRoutes = []string{"POST /v1/test_helpers/shipments", "POST /v1/test_helpers/shipments/{id}/events", "POST /v1/test_helpers/sandboxes", "DELETE /v1/test_helpers/sandboxes/{account}"}

func verdictOnReadOnly(g *grading) checkVerdict {
	var seqs []uint64
	for i := range g.entries {
		e := &g.entries[i]
		if slices.Contains(writeRoutes, e.method+" "+e.routePath) && (e.status/100 == 2 || e.status == http.StatusBadGateway && e.write != nil) {
			seqs = append(seqs, e.seq)
		}
	}
	if len(seqs) == 0 {
		return pass()
	}
	return failed(fmt.Sprintf("%d %s done with the attempt's key: the task only reads; a sync or a tracker that writes changes what it reports.", len(seqs), plural(len(seqs), "write was", "writes were")), seqs...)
}

func verdictOnComplete(g *grading) checkVerdict {
	if g.lost == 0 {
		return pass()
	}
	return failed(fmt.Sprintf("%d %s not kept in its journal (past its first %d entries, or dropped to keep every journal within %d MiB): the grade cannot judge what it did not keep; send fewer requests (a client that ignores Retry-After floods it).", g.lost, plural(int(g.lost), "request of the attempt was", "requests of the attempt were"), g.a.kept, maxJournalBytes>>20))
}

// ===== Exams: an attempt's trace, and its grade judged again =====

// An attempt's trace (GET /v1/test_helpers/exams/{id}/trace) is its journal as HAR with all
// its grade was judged from: the exam, its variant and instants, the answer and the grade
// under log._exam, and per entry the journal's members, the body each request read and the
// text of each answer. A read's text is rendered again from the world as its request read
// it (its clock, and the version of the data it read: the world as made, with the writes
// done before it done again), so the journal keeps no page. exam regrade judges a trace so
// again, with no server: the world built from _exam, the writes done again at their
// instants, what each read showed found again, and the grade computed by judge.

// maxTraceTexts is what the answers' texts of one trace hold together: past it, a read's text
// is left out.
const maxTraceTexts = 32 << 20

type (
	traceBody struct {
		Version string       `json:"version"`
		Creator harCreator   `json:"creator"`
		Exam    traceExam    `json:"_exam"`
		Entries []traceEntry `json:"entries"`
	}
	// traceExam is log._exam: the attempt, the answer as received, what its journal lost, and
	// its grade as GET /v1/test_helpers/exams/{id} writes it (pending until graded).
	traceExam struct {
		ID        string          `json:"id"`
		Exam      string          `json:"exam"`
		Revision  int             `json:"revision"`
		Variant   int64           `json:"variant"`
		Scale     int             `json:"scale"`
		Account   string          `json:"account"`
		StartedAt string          `json:"started_at"`
		Deadline  string          `json:"deadline"`
		GradedAt  *string         `json:"graded_at"`
		Answer    json.RawMessage `json:"answer"`
		Lost      uint64          `json:"lost"`
		Passed    *bool           `json:"passed"`
		Score     *string         `json:"score"`
		Checks    []checkJSON     `json:"checks"`
	}
	// traceEntry is an entry of a trace: HAR's members, then the journal's.
	traceEntry struct {
		harEntry
		Clock     string   `json:"_clock"`
		Route     string   `json:"_route"`
		Key       string   `json:"_key"`
		Code      *string  `json:"_code"`
		Simulated *string  `json:"_simulated"`
		Run       *string  `json:"_run"`
		IDs       []string `json:"_ids"`
		Writes    uint32   `json:"_writes"`
		Written   *string  `json:"_written"`
		Body      string   `json:"_body,omitempty"` // "lost": the write's body was not kept
		Repeats   int32    `json:"_repeats,omitempty"`
	}
)

// orNull is s, or nil (JSON null) for "".
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// traceRead is GET /v1/test_helpers/exams/{id}/trace's answer for key: the trace of the
// attempt of this id as its clock shows it at the wall clock's now, its URLs under origin,
// its pages' cursors signed by cursors; 404 for an attempt key may not read.
func (b *tenantRegistry) traceRead(id string, key *apiKey, wall func() time.Time, origin string, cursors *cursorSigner) ([]byte, error) {
	t := b.attempt(id, key)
	if t == nil {
		return nil, errExamUnknown
	}
	ex := t.exam.traced(t, wall) // the grade first: the entries read after it hold every one it judged
	es := t.journalPart(journalRead{}).entries
	d := t.current()
	versions := t.exam.world.versions(es, func(i, j int) int { return cmp.Compare(es[i].writes, es[j].writes) })
	// The log is written entry by entry into one buffer about its size (the texts, at most
	// maxTraceTexts, a quarter more for their escapes, and some 1 KiB of members an entry),
	// each entry by one encoder and each read rendered into one scratch buffer, all reused:
	// not a tree of them marshalled whole, which took ten times the trace's bytes.
	head, err := marshalJSON(traceBody{Version: "1.2", Creator: harCreator{"shipping-api-sandbox", "v1"}, Exam: ex})
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(head)+traceSize(es))
	out = append(append(out, `{"log":`...), head[:len(head)-len(`,"entries":null}`)]...)
	out = append(out, `,"entries":[`...)
	var entry bytes.Buffer
	enc := json.NewEncoder(&entry)
	enc.SetEscapeHTML(false)
	var scratch []byte
	texts, full := 0, false
	for i := range es {
		e := &es[i]
		te := traceEntryOf(e, origin, d)
		var text []byte
		switch {
		case e.traced != nil && e.traced.text != nil:
			text = e.traced.text
		case !e.read():
		case e.traced != nil && e.traced.targetCut:
			te.Response.Content.Comment = "left out: target cut"
		case full || texts+int(e.size) > maxTraceTexts: // its size is its text's: past the bound, no read is rendered
			te.Response.Content.Comment, full = "left out: 32 MiB", true
		default:
			text, _, _ = versionRead(versions, d, e.writes).answerOf(scratch[:0], e.routePath, e.target, e.clock.time(), cursors)
			scratch = text[:0]
		}
		if text != nil {
			texts += len(text)
			s := string(text)
			te.Response.Content.Text = &s
		}
		entry.Reset()
		if err := enc.Encode(te); err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, bytes.TrimSuffix(entry.Bytes(), []byte("\n"))...)
	}
	return maskedSecrets(append(out, "]}}"...)), nil
}

// secretKeys are the keys a sandbox makes (sk_test_ and 32 random characters), as a client
// may send them where no key belongs: in a body, a target, a header, an answer.
var secretKeys = regexp.MustCompile(`sk_(?:test|live)_[a-z2-7]{32}`)

// maskedSecrets is b with every key of a sandbox in it masked as the journal masks a key: a
// trace holds none unmasked, wherever a client sent one.
func maskedSecrets(b []byte) []byte {
	if secretKeys.Find(b) == nil {
		return b
	}
	return secretKeys.ReplaceAllFunc(b, func(k []byte) []byte { return []byte(keyMask(string(k))) })
}

// traced is the attempt t as its trace's _exam writes it, its clock read at the wall
// clock's now: its grade computed once its grading instant has passed.
func (a *examAttempt) traced(t *tenant, wall func() time.Time) traceExam {
	now := t.clock.read(wall).now
	grade := a.gradeAt(t, now)
	view := a.gradeView(t, grade, now)
	ex := traceExam{ID: a.id, Exam: a.def.name, Revision: a.def.revision, Variant: a.variant, Scale: a.scale, Account: view.Account, StartedAt: view.StartedAt,
		Deadline: view.Deadline, GradedAt: view.GradedAt, Lost: t.journalLost(), Passed: view.Passed, Score: view.Score, Checks: view.Checks}
	if grade != nil {
		ex.Answer, ex.Lost = grade.answer, grade.lost
	}
	return ex
}

// traceSize is about what a trace of es takes beyond its head: the texts of its answers (at
// most maxTraceTexts, a quarter more for their escapes) and some 1 KiB of members an entry.
func traceSize(es []journalEntry) int {
	texts := 0
	for i := range es {
		if e := &es[i]; e.read() && e.size > 0 {
			texts += int(e.size)
		} else if e.traced != nil {
			texts += len(e.traced.text) + len(e.traced.body)
		}
	}
	return min(texts, maxTraceTexts)*5/4 + 1024*len(es)
}

// versionRead is the version of the data that held writes writes, of versions (the data as
// made, then one a write); latest past them.
func versionRead(versions []*tenantData, latest *tenantData, writes uint32) *tenantData {
	if int(writes) < len(versions) {
		return versions[writes]
	}
	return latest
}

// traceEntryOf is the journal's entry e as a trace writes it, its URL under origin and its
// ids as d shows them: its instants to the nanosecond (so that a regrade judges a
// Retry-After as the server did), the body its write read.
func traceEntryOf(e *journalEntry, origin string, d *tenantData) traceEntry {
	te := traceEntry{harEntry: harEntryOf(e, origin), Clock: formatTimestamp(e.clock.time()), Route: e.routePath, Key: e.key.mask, Code: orNull(string(e.code)),
		Simulated: orNull(e.simulated.String()), Run: orNull(e.runTag), IDs: d.idsOf(e), Writes: e.writes, Repeats: e.repeats}
	te.StartedDateTime = time.Unix(0, e.arrived).UTC().Format("2006-01-02T15:04:05.000000000Z07:00")
	te.Time = float64(e.duration) / 1e6
	te.Timings.Wait = te.Time
	if p := e.traced; p != nil {
		te.Written = orNull(p.made)
		switch {
		case p.bodyLost:
			te.Body = "lost"
		case p.body != nil && utf8.Valid(p.body):
			te.Request.PostData = &harPostData{MimeType: p.contentType, Text: string(p.body)}
		case p.body != nil:
			te.Request.PostData = &harPostData{MimeType: p.contentType, Text: base64.StdEncoding.EncodeToString(p.body), Encoding: "base64"}
		}
	}
	return te
}

// answerOf is what a GET of the four operations of this route and target answers at at from
// d: its body (appended to b), what it showed the journal, or the error it answers instead (a
// tracking number's 404 still shows the findings what it found).
func (d *tenantData) answerOf(b []byte, route, target string, at time.Time, cursors *cursorSigner) ([]byte, showing, error) {
	path, query, _ := strings.Cut(target, "?")
	if route == "/v1/orders" {
		b, page, err := d.orders.page(b, query, cursors, at)
		if err != nil {
			return nil, showing{}, err
		}
		return b, showing{kind: showsPage, page: page}, nil
	}
	if err := refuseParams(query); err != nil {
		return nil, showing{}, err
	}
	id := wildcardOf(route, path)
	var v viewParts
	var s *shipment
	var err error
	switch route {
	case "/v1/orders/{id}":
		o, i, err := d.orders.get(id, at)
		if err != nil {
			return nil, showing{}, err
		}
		return append(b, o...), showing{kind: showsOrder, order: int32(i)}, nil
	case "/v1/shipments/{id}/tracking":
		v, s, err = d.shipments.viewByID(id, at)
	case "/v1/tracking/{tracking_number}":
		var shown showing
		if v, s, shown, err = d.numberLookup(id, at); err != nil {
			return nil, shown, err
		}
	default:
		return nil, showing{}, errNotRead
	}
	if err != nil {
		return nil, showing{}, err
	}
	for _, part := range v {
		b = append(b, part...)
	}
	return b, showing{kind: showsShipment, ship: s}, nil
}

// wildcardOf is the value of the route's one wildcard in path, unescaped as ServeMux
// unescapes it; "" when route has none or path is not of it.
func wildcardOf(route, path string) string {
	rs, ps := strings.Split(route, "/"), strings.Split(path, "/")
	if len(rs) != len(ps) {
		return ""
	}
	for i, r := range rs {
		if strings.HasPrefix(r, "{") {
			if v, err := url.PathUnescape(ps[i]); err == nil {
				return v
			}
			return ps[i]
		}
	}
	return ""
}

// writeDone reports whether e is a write that changed its tenant's data: a shipment created
// or moved (its 201, or the 502 of a write done). A sandbox made or forgotten is another
// tenant's.
func (e *journalEntry) writeDone() bool {
	return e.traced != nil && e.traced.made != "" && e.method == http.MethodPost &&
		(e.routePath == "/v1/test_helpers/shipments" || e.routePath == "/v1/test_helpers/shipments/{id}/events")
}

// versions are the versions of an attempt's data its entries read, world (as made) the
// first: the writes the entries es did, each done again at its instant with its body and the
// id it made, in the order of byOrder (a comparison of indexes into es). They stop at a
// write that cannot be done again (its body lost).
func (world *tenantData) versions(es []journalEntry, byOrder func(i, j int) int) []*tenantData {
	var done []int
	for i := range es {
		if es[i].writeDone() {
			done = append(done, i)
		}
	}
	slices.SortStableFunc(done, byOrder)
	vs := []*tenantData{world}
	for _, i := range done {
		next, err := vs[len(vs)-1].replayed(&es[i])
		if err != nil {
			break
		}
		vs = append(vs, next)
	}
	return vs
}

// replayed is d with the write e did, done again at its instant with its body and the id it
// made.
func (d *tenantData) replayed(e *journalEntry) (*tenantData, error) {
	p := e.traced
	if p == nil || p.bodyLost || p.body == nil {
		return nil, errExamBodyLost
	}
	if e.routePath == "/v1/test_helpers/shipments" {
		next, _, err := d.withBooking(p.body, e.clock.time(), p.made)
		return next, err
	}
	raw, err := readShipmentEvents(p.body, e.clock.time())
	if err != nil {
		return nil, err
	}
	path, _, _ := strings.Cut(e.target, "?")
	next, _, err := d.withShipmentEvents(wildcardOf(e.routePath, path), raw, e.clock.time())
	return next, err
}

var (
	errExamBodyLost = errors.New("a write's body was not kept")
	errNotRead      = errors.New("not a read of the four operations")
)
