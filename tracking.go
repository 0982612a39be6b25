// tracking.go is shipments and their tracking: raw carrier events normalized at load, the
// tracking views prepared once, the index of a tenant's shipments (by id, by primary
// tracking number, by creation), a shipment created in a sandbox (the body of POST
// /v1/test_helpers/shipments, and the index's next version), events arriving for a
// sandbox's shipment (the body of POST /v1/test_helpers/shipments/{id}/events, and the
// shipment rebuilt), shipments and events shown as the request's instant allows, and the
// two operations. Its sections (grep '^// =====' *.go):
//
//   - Normalizing raw carrier events
//   - Shipments as a dataset holds them
//   - A shipment's tracking view, prepared once
//   - The index: a tenant's shipments
//   - A record made a shipment: what loading and booking share
//   - A shipment created in a sandbox
//   - Shipment events: carrier events added to a sandbox's shipment
//   - The two operations: GET /v1/shipments/{id}/tracking and GET /v1/tracking/{tracking_number}
package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"
	"unsafe"
)

// ===== Normalizing raw carrier events =====

// Tracking statuses: shipment status and events[].status.
var trackingStatuses = []string{
	"pre_transit", "in_transit", "out_for_delivery", "available_for_pickup", "delivered",
	"return_to_sender", "failure", "cancelled", "unknown",
}

// rawEvent is a carrier event as the dataset holds it, before normalization. The timestamp
// is kept raw: a value that is not an RFC 3339 string drops the event, it does not refuse
// the dataset. After is the dataset author's schedule instead of a timestamp: the event
// happens that long after the sandbox's start instant.
type rawEvent struct {
	Timestamp   jsonScalar
	After       jsonScalar
	Status      string
	Description *string
	Location    *string

	scheduled bool      // it has an after: it happens at
	at        time.Time // the start instant plus after
}

var eventShape = shapeOf(
	anyScalar("timestamp", func(e *rawEvent) *jsonScalar { return &e.Timestamp }),
	anyScalar("after", func(e *rawEvent) *jsonScalar { return &e.After }),
	shared("status", func(e *rawEvent) *string { return &e.Status }),
	optional("description", func(e *rawEvent) **string { return &e.Description }),
	optional("location", func(e *rawEvent) **string { return &e.Location }),
)

func (e *rawEvent) decode(d *jsonReader, path string) error { return eventShape.read(d, path, e) }

// trackingEvent is a stored, normalized event as the API shows it.
type trackingEvent struct {
	Status      string `json:"status"`
	Description string `json:"description"`
	Timestamp   string `json:"timestamp"`
	Location    string `json:"location"`
}

// normalization counts what normalizing a shipment's raw events left out.
type normalization struct {
	dropped    int // timestamp not interpretable
	duplicates int // same instant and description as an earlier event
}

// stampedEvent is a normalized event with its instant, and whether the dataset scheduled it
// (with after) rather than the carrier timing it.
type stampedEvent struct {
	at        time.Time
	scheduled bool
	trackingEvent
}

// normalizeEvents turns raw carrier events into stored events: events whose timestamp is
// not strict RFC 3339 with an offset are dropped; an event scheduled with after happens at
// start plus after; instants are kept and written in UTC; an event with the instant and
// description of an earlier one is a duplicate (the first is kept); events are ordered
// oldest first, stable for equal instants; a missing location is "".
func normalizeEvents(raw []rawEvent) ([]stampedEvent, normalization) {
	type identity struct {
		at          time.Time
		description string
	}
	var n normalization
	stored := make([]stampedEvent, 0, len(raw))
	seen := make(map[identity]bool, len(raw))
	for _, e := range raw {
		at, err := eventInstant(e)
		if err != nil {
			n.dropped++
			continue
		}
		id := identity{at, *e.Description}
		if seen[id] {
			n.duplicates++
			continue
		}
		seen[id] = true
		ev := trackingEvent{Status: e.Status, Description: *e.Description, Timestamp: formatTimestamp(at)}
		if e.Location != nil {
			ev.Location = *e.Location
		}
		stored = append(stored, stampedEvent{at, e.scheduled, ev})
	}
	slices.SortStableFunc(stored, func(a, b stampedEvent) int { return a.at.Compare(b.at) })
	return stored, n
}

// eventInstant is when a raw event happened: as scheduled with after, or its timestamp as
// the carrier sent it.
func eventInstant(e rawEvent) (time.Time, error) {
	if e.scheduled {
		return e.at, nil
	}
	if !e.Timestamp.isString {
		return time.Time{}, errNotRFC3339
	}
	return parseTimestamp(e.Timestamp.text)
}

// readAfter reads a raw event's schedule into it: null or absent (not scheduled), or a
// JSON string holding a Go duration, negative for an event before the start instant,
// never beside a timestamp. It is the dataset author's schedule, not carrier data: a bad
// one refuses the dataset, and so does one that places the event outside the years 0000
// to 9999.
func readAfter(path string, e *rawEvent, start time.Time) error {
	if !e.After.given {
		return nil
	}
	if e.Timestamp.given {
		return &datasetError{path: path + ".after", reason: "an event has a timestamp or an after, not both"}
	}
	if !e.After.isString {
		return &datasetError{path: path + ".after", reason: "must be a string holding a duration such as \"90s\", \"2m30s\" or \"-72h\""}
	}
	s := e.After.text
	d, err := time.ParseDuration(s)
	if err != nil {
		return &datasetError{path: path + ".after", reason: strconv.Quote(s) + " is not a duration such as \"90s\", \"2m30s\" or \"-72h\""}
	}
	e.scheduled, e.at = true, start.Add(d).UTC()
	if !writable(e.at) {
		return &datasetError{path: path + ".after", reason: fmt.Sprintf("%q places the event outside the years 0000 to 9999 (the start instant is %s)", s, formatTimestamp(start))}
	}
	return nil
}

// ===== Shipments as a dataset holds them =====

// shipmentRecord is a shipment as the dataset holds it.
type shipmentRecord struct {
	ID             string
	Account        string
	Environment    string
	Reference      string
	TrackingNumber *string
	// ParcelTrackingNumbers are the numbers of further parcels of the consignment; lookup
	// by tracking number matches the primary number only.
	ParcelTrackingNumbers []string
	OrderID               *string
	CreatedAt             *string // absent: it always existed
	Events                []rawEvent
}

var shipmentShape = shapeOf(
	text("id", func(r *shipmentRecord) *string { return &r.ID }),
	shared("account", func(r *shipmentRecord) *string { return &r.Account }),
	shared("environment", func(r *shipmentRecord) *string { return &r.Environment }),
	text("reference", func(r *shipmentRecord) *string { return &r.Reference }),
	optional("tracking_number", func(r *shipmentRecord) **string { return &r.TrackingNumber }),
	texts("parcel_tracking_numbers", func(r *shipmentRecord) *[]string { return &r.ParcelTrackingNumbers }),
	optional("order_id", func(r *shipmentRecord) **string { return &r.OrderID }),
	optional("created_at", func(r *shipmentRecord) **string { return &r.CreatedAt }),
	records("events", func(r *shipmentRecord) *[]rawEvent { return &r.Events }),
)

func (rec *shipmentRecord) decode(d *jsonReader, path string) error {
	return shipmentShape.read(d, path, rec)
}

// ===== A shipment's tracking view, prepared once =====

// trackingView is the body both tracking operations answer with. Events is its last member,
// and must stay so: viewPrefix writes each view's head once, up to "events":[, and a view
// is that head, then its events (a view that does not end in its events is refused there).
type trackingView struct {
	ShipmentID     string          `json:"shipment_id"`
	Reference      string          `json:"reference"`
	TrackingNumber *string         `json:"tracking_number"`
	Status         string          `json:"status"`
	Events         []trackingEvent `json:"events"`
}

// shipment is a stored shipment, its tracking view prepared once: the view with every event
// (the usual answer, written as it is), and, for a clock that hides later events, the
// parts a view of the first k events is made of. A view is a head (the view up to its
// events, which names the status: one for pre_transit, and one for each status its events
// take) and the first k events' JSON, which is one slice of events.
type shipment struct {
	id             string
	trackingNumber *string
	parcels        []string  // further parcels' numbers: a lookup by one is 404 (primary numbers only), which the findings name
	createdAt      instant   // dawn: it always existed; before it, the shipment is not found
	dropped        int       // raw events not interpretable, dropped at load
	full           []byte    // the view with every event
	heads          [][]byte  // indexed like trackingStatuses: the view up to `"events":[`
	events         []byte    // every event's JSON, joined by commas
	ends           []int     // where each event's JSON ends in events
	instants       []instant // when each event happened, oldest first
	statuses       []uint8   // each event's status, an index into trackingStatuses
}

// bytes is about what the shipment holds on the heap, each field counted (its heads are cut
// from one buffer, so their lengths sum to it).
func (s *shipment) bytes() int64 {
	n := int(unsafe.Sizeof(*s)) + len(s.id) + len(s.full) + len(s.events) + len(s.ends)*8 + len(s.instants)*int(unsafe.Sizeof(instant{})) +
		len(s.statuses) + len(s.heads)*int(unsafe.Sizeof([]byte(nil)))
	if s.trackingNumber != nil {
		n += len(*s.trackingNumber) + 16
	}
	for _, p := range s.parcels {
		n += len(p) + 16
	}
	for _, h := range s.heads {
		n += len(h)
	}
	return int64(n)
}

// newShipment prepares a shipment's view: created at load, or in a sandbox. Each event is
// encoded once.
func newShipment(rec shipmentRecord, events []stampedEvent) (*shipment, error) {
	prefix, err := viewPrefix(rec)
	if err != nil {
		return nil, err
	}
	laid := make([]laidEvent, 0, len(events))
	for _, e := range events {
		le, err := laidOf(e)
		if err != nil {
			return nil, err
		}
		laid = append(laid, le)
	}
	return laidShipment(&shipment{id: rec.ID, trackingNumber: rec.TrackingNumber, parcels: rec.ParcelTrackingNumbers}, prefix, laid), nil
}

// viewPrefix is the view of a shipment up to "status": its head but for the status and
// the events, which follow it.
func viewPrefix(rec shipmentRecord) ([]byte, error) {
	view, err := marshalJSON(trackingView{ShipmentID: rec.ID, Reference: rec.Reference, TrackingNumber: rec.TrackingNumber, Status: trackingStatuses[0], Events: []trackingEvent{}})
	if err != nil {
		return nil, err
	}
	prefix, ok := bytes.CutSuffix(view, []byte(headTail(0)+`]}`))
	if !ok {
		return nil, errors.New("a tracking view must end in its status and its events: trackingView's last members are Status and Events")
	}
	return prefix, nil
}

// headTail is what follows a view's prefix in its head of the status of index st: the
// status, then the events' opening.
func headTail(st int) string { return `"status":"` + trackingStatuses[st] + `","events":[` }

// prefix is s's view up to "status", as viewPrefix wrote it: what every head begins with.
func (s *shipment) prefix() []byte { return s.heads[0][:len(s.heads[0])-len(headTail(0))] }

// laidEvent is a stored event as a shipment lays it out: its instant, its status (an index
// into trackingStatuses) and its JSON.
type laidEvent struct {
	at     instant
	status uint8
	json   []byte
}

// laidOf is a normalized event as a shipment stores it: its JSON written once, the one
// encoding of an event, at load and when events arrive.
func laidOf(e stampedEvent) (laidEvent, error) {
	b, err := marshalJSON(e.trackingEvent)
	return laidEvent{instantOf(e.at), uint8(slices.Index(trackingStatuses, e.Status)), b}, err
}

// laidShipment is s, which names the shipment, with its view laid out from prefix (the view
// up to "status") and its events, oldest first: the one builder of a shipment's view.
func laidShipment(s *shipment, prefix []byte, events []laidEvent) *shipment {
	s.lay(prefix, events)
	return s
}

// lay lays out s's view: its events' JSON joined, and the heads a view shows (pre_transit,
// and its events' statuses), each prefix (the view up to "status") then the status, cut from
// one buffer: sandboxes hold thousands of shipments, and every byte and object kept is one
// the collector marks at each cycle.
func (s *shipment) lay(prefix []byte, events []laidEvent) {
	s.events, s.ends, s.instants, s.statuses = nil, make([]int, 0, len(events)), make([]instant, 0, len(events)), make([]uint8, 0, len(events))
	for _, e := range events {
		if len(s.events) > 0 {
			s.events = append(s.events, ',')
		}
		s.events = append(s.events, e.json...)
		s.ends = append(s.ends, len(s.events))
		s.instants = append(s.instants, e.at)
		s.statuses = append(s.statuses, e.status)
	}
	var heads []byte
	ends := make([]int, len(trackingStatuses))
	for i := range trackingStatuses {
		if i == 0 || slices.Contains(s.statuses, uint8(i)) {
			heads = append(append(heads, prefix...), headTail(i)...)
		}
		ends[i] = len(heads)
	}
	s.heads = make([][]byte, len(trackingStatuses))
	from := 0
	for i, end := range ends {
		if end > from {
			s.heads[i], from = heads[from:end:end], end
		}
	}
	s.full = s.joinedView(len(events))
}

// joinedView is the tracking view of the first k events, as one slice.
func (s *shipment) joinedView(k int) []byte {
	head, events := s.parts(k)
	return append(append(append([]byte(nil), head...), events...), "]}"...)
}

// parts are the view of the first k events but for its closing "]}": the head of the
// status of the last shown event (pre_transit when none), and the events' JSON.
func (s *shipment) parts(k int) (head, events []byte) {
	if k == 0 {
		return s.heads[0], nil
	}
	return s.heads[s.statuses[k-1]], s.events[:s.ends[k-1]]
}

// existsAt reports whether the shipment is found at at: from its creation on.
func (s *shipment) existsAt(at time.Time) bool { return !s.createdAt.after(instantOf(at)) }

// shown is how many events the clock shows at at: those at or before it.
func (s *shipment) shown(at time.Time) int {
	now := instantOf(at)
	return sort.Search(len(s.instants), func(i int) bool { return s.instants[i].after(now) })
}

// statusAt is the shipment's status as the clock shows it at at.
func (s *shipment) statusAt(at time.Time) string {
	if k := s.shown(at); k > 0 {
		return trackingStatuses[s.statuses[k-1]]
	}
	return trackingStatuses[0]
}

// viewParts is a tracking view as an answer writes it: its parts, one after another, so that a
// view the clock cuts short is not assembled first.
type viewParts [3][]byte

// viewAt is the view as the clock shows it at at: the events at or before at.
func (s *shipment) viewAt(at time.Time) viewParts {
	k := s.shown(at)
	if k == len(s.instants) {
		return viewParts{s.full}
	}
	head, events := s.parts(k)
	return viewParts{head, events, viewEnd}
}

// viewEnd closes a tracking view's events and the view; never modified.
var viewEnd = []byte("]}")

// ===== The index: a tenant's shipments =====

// shipmentIndex is a tenant's shipments, by id and by primary tracking number, and what
// their dataset schedules.
type shipmentIndex struct {
	tenantName       string                    // the account and environment, as messages name them
	start            time.Time                 // while loading: the instant relative instants count from
	list             []*shipment               // in the dataset's order; a write that moves a shipment replaces it at its place, in a copy of the list
	byID             map[string]int32          // each shipment's place in list: a write that moves one shares it
	byTrackingNumber map[string]*numberHolders // the shipments that hold each primary number, by their places
	byParcel         map[string]*numberHolders // the shipments that hold each further parcel's number: nil until one does
	created          createdTree               // finds the shipments found at an instant without a scan
	creations        []instant                 // the creation instants given, sorted: how many are found
	happenings       []happening               // while loading: creations and events scheduled with after
	held             int64                     // what its shipments and numbers hold, each counted as it is filed: a write counts only what it changes
}

// bytes is about what the index holds on the heap, its shipments included, every field
// counted here.
func (ix *shipmentIndex) bytes() int64 {
	n := int64(len(ix.tenantName)) + int64(unsafe.Sizeof(*ix)) + int64(len(ix.list))*8 + int64(len(ix.creations))*int64(unsafe.Sizeof(instant{})) +
		int64(len(ix.created.min))*int64(unsafe.Sizeof(instant{})) + int64(len(ix.happenings))*int64(unsafe.Sizeof(happening{})) +
		int64(len(ix.byID))*48 + int64(len(ix.byTrackingNumber)+len(ix.byParcel))*(48+int64(unsafe.Sizeof(numberHolders{})))
	return n + ix.held
}

// newShipmentIndex is the shipments of owner, an account's environment, whose relative
// instants count from start.
func newShipmentIndex(owner string, start time.Time) shipmentIndex {
	return shipmentIndex{tenantName: owner, start: start, byID: map[string]int32{}, byTrackingNumber: map[string]*numberHolders{}}
}

// addShipment checks one dataset shipment, normalizes its events (those scheduled with
// after happen after start), prepares its view and files it.
func (ix *shipmentIndex) addShipment(path string, rec shipmentRecord) (*shipment, normalization, error) {
	if err := vetShipment(path, rec); err != nil {
		return nil, normalization{}, err
	}
	if ix.find(rec.ID) != nil {
		return nil, normalization{}, &datasetError{path: path + ".id", reason: fmt.Sprintf("duplicate shipment id %q in %s", rec.ID, ix.tenantName)}
	}
	createdAt := dawn
	if rec.CreatedAt != nil {
		at, err := instantField(path, "created_at", *rec.CreatedAt, ix.start)
		if err != nil {
			return nil, normalization{}, err
		}
		createdAt = instantOf(at)
	}
	s, events, n, err := prepareShipment(path, rec, createdAt, ix.start)
	if err != nil {
		return nil, n, err
	}
	ix.file(s, events)
	return s, n, nil
}

// file indexes a shipment: by id, by primary tracking number (the shipments that hold one
// number are chained, the last filed first), and what its dataset schedules.
func (ix *shipmentIndex) file(s *shipment, events []stampedEvent) {
	ix.list = append(ix.list, s)
	ix.held += s.bytes()
	place := int32(len(ix.list) - 1)
	ix.byID[s.id] = place
	if number := s.trackingNumber; number != nil {
		if ix.byTrackingNumber[*number] == nil {
			ix.held += int64(len(*number))
		}
		ix.byTrackingNumber[*number] = ix.byTrackingNumber[*number].with(place, s)
	}
	for _, p := range s.parcels {
		if ix.byParcel == nil {
			ix.byParcel = map[string]*numberHolders{}
		}
		if ix.byParcel[p] == nil {
			ix.held += int64(len(p))
		}
		ix.byParcel[p] = ix.byParcel[p].with(place, s)
	}
	if s.createdAt != dawn {
		ix.creations = append(ix.creations, s.createdAt)
		ix.happenings = append(ix.happenings, happening{at: s.createdAt.time(), kind: shipmentCreated, id: s.id})
	}
	for _, e := range events {
		if e.scheduled {
			ix.happenings = append(ix.happenings, happening{at: e.at, kind: shipmentEvent, id: s.id, status: e.Status})
		}
	}
}

// find is the shipment id, or nil.
func (ix *shipmentIndex) find(id string) *shipment {
	if place, ok := ix.byID[id]; ok {
		return ix.list[place]
	}
	return nil
}

// count is how many shipments the tenant has.
func (ix *shipmentIndex) count() int { return len(ix.list) }

// build prepares what the index finds without a scan, once every shipment is added.
func (ix *shipmentIndex) build() {
	slices.SortFunc(ix.creations, instant.compare)
	if len(ix.creations) > 0 {
		ix.created = newCreatedTree(ix.list)
	}
}

// shownShipment is a shipment as a list shows it at an instant.
type shownShipment struct {
	id, trackingNumber, status string // trackingNumber "" for none
	shared                     bool   // another shipment found then holds its number
	dropped                    int    // raw events dropped at load
}

// firstShown is the first n shipments, in the dataset's order, that are found at at, and
// how many more are.
func (ix *shipmentIndex) firstShown(at time.Time, n int) ([]shownShipment, int) {
	var shown []shownShipment
	add := func(s *shipment) {
		sh := shownShipment{id: s.id, status: s.statusAt(at), dropped: s.dropped}
		if s.trackingNumber != nil {
			sh.trackingNumber, sh.shared = *s.trackingNumber, ix.sharedAt(*s.trackingNumber, at)
		}
		shown = append(shown, sh)
	}
	if len(ix.creations) == 0 { // every shipment always existed
		for _, s := range ix.list[:min(n, len(ix.list))] {
			add(s)
		}
		return shown, len(ix.list) - len(shown)
	}
	now := instantOf(at)
	for i := ix.created.next(0, now); i < len(ix.list) && len(shown) < n; i = ix.created.next(i+1, now) {
		add(ix.list[i])
	}
	found := len(ix.list) - len(ix.creations) + sort.Search(len(ix.creations), func(k int) bool { return ix.creations[k].after(now) })
	return shown, found - len(shown)
}

// numberHolders are the shipments of a tenant that hold one primary tracking number, as
// far as a lookup needs them: at any instant the number is held by none, by one (the
// first created), or by several (from the second's creation on), and then by as many as
// have been created by that instant.
type numberHolders struct {
	first   int32     // the first created's place in the index's list (of two created at once, either)
	firstAt instant   // its creation
	second  instant   // the creation of the second, never when there is none
	created []instant // every holder's creation, as filed, once two hold it; nil for one
}

// with is h once s holds the number too: h itself when that changes nothing, else new
// holders (h may be read by a version of the data a request holds). Their creations are
// appended to h's: a version reads only as many as it has, and the next version is built
// from the newest (a tenant's writes are built one at a time), so none sees another's;
// loading stays linear in the holders of a number.
func (h *numberHolders) with(place int32, s *shipment) *numberHolders {
	if h == nil {
		return &numberHolders{first: place, firstAt: s.createdAt, second: never}
	}
	next := &numberHolders{first: h.first, firstAt: h.firstAt, second: h.second, created: h.created}
	if next.created == nil {
		next.created = []instant{h.firstAt}
	}
	next.created = append(next.created, s.createdAt)
	switch {
	case h.firstAt.after(s.createdAt):
		next.first, next.firstAt, next.second = place, s.createdAt, h.firstAt
	case h.second.after(s.createdAt):
		next.second = s.createdAt
	}
	return next
}

// countAt is how many shipments found at at hold the number: a walk of their creations,
// made only for the domain adapter's 409 (in a sandbox: at most maxSandboxShipments).
func (h *numberHolders) countAt(at instant) int {
	if h.created == nil {
		if h.firstAt.after(at) {
			return 0
		}
		return 1
	}
	n := 0
	for _, c := range h.created {
		if !c.after(at) {
			n++
		}
	}
	return n
}

// holder is the one shipment found at at with this primary tracking number; when several
// are (errTrackingAmbiguous), the first created of them.
func (ix *shipmentIndex) holder(number string, at time.Time) (*shipment, error) {
	h, now := ix.byTrackingNumber[number], instantOf(at)
	switch {
	case h == nil || h.firstAt.after(now):
		return nil, errTrackingNotFound
	case !h.second.after(now):
		return ix.list[h.first], errTrackingAmbiguous
	}
	return ix.list[h.first], nil
}

// parcelHolder is the shipment found at at that holds number as a further parcel's, when no
// shipment found then holds it as its primary number; else nil. Of several such, the first
// created.
func (ix *shipmentIndex) parcelHolder(number string, at time.Time) (*shipment, int) {
	h, now := ix.byParcel[number], instantOf(at)
	if h == nil || h.firstAt.after(now) {
		return nil, -1
	}
	if p := ix.byTrackingNumber[number]; p != nil && !p.firstAt.after(now) {
		return nil, -1
	}
	s := ix.list[h.first]
	return s, slices.Index(s.parcels, number)
}

// sharedAt reports whether more than one shipment found at at holds this tracking number:
// a lookup by number then answers 404.
func (ix *shipmentIndex) sharedAt(number string, at time.Time) bool {
	_, err := ix.holder(number, at)
	return err == errTrackingAmbiguous
}

// holdersAt is how many shipments found at at hold this primary tracking number.
func (ix *shipmentIndex) holdersAt(number string, at time.Time) int {
	if h := ix.byTrackingNumber[number]; h != nil {
		return h.countAt(instantOf(at))
	}
	return 0
}

// createdTree finds, in the dataset's order, the next shipment found at an instant, without
// a scan: a segment tree of the earliest creation in each range of shipments (a shipment
// that always existed is created at dawn).
type createdTree struct {
	n    int
	leaf int       // where the leaves start: a power of two
	min  []instant // min[1] is the root; min[leaf+i] is shipment i's creation
}

func newCreatedTree(list []*shipment) createdTree {
	t := createdTree{n: len(list), leaf: 1}
	for t.leaf < len(list) {
		t.leaf *= 2
	}
	t.min = make([]instant, 2*t.leaf)
	for i := range t.leaf {
		switch {
		case i >= len(list):
			t.min[t.leaf+i] = never
		default:
			t.min[t.leaf+i] = list[i].createdAt
		}
	}
	for j := t.leaf - 1; j >= 1; j-- {
		t.min[j] = t.min[2*j]
		if t.min[j].after(t.min[2*j+1]) {
			t.min[j] = t.min[2*j+1]
		}
	}
	return t
}

// next is the first shipment from i on that is found at at, or n.
func (t *createdTree) next(i int, at instant) int {
	if i >= t.n {
		return t.n
	}
	j := t.leaf + i
	for t.min[j].after(at) { // climb to the next range to the right that holds one
		for j&1 == 1 {
			if j == 1 {
				return t.n
			}
			j >>= 1
		}
		j++
	}
	for j < t.leaf { // and descend to its first
		j *= 2
		if t.min[j].after(at) {
			j++
		}
	}
	return j - t.leaf
}

// ===== A record made a shipment: what loading and booking share =====

// A shipment's record (a dataset's, or a booking's body) becomes a shipment in one step that
// loading and the booking share: its ids and numbers checked, its raw events read and
// normalized, its view prepared.

// vetShipment checks a shipment's ids and numbers.
func vetShipment(path string, rec shipmentRecord) error {
	if err := checkID(path, "id", rec.ID); err != nil {
		return err
	}
	if err := checkID(path, "reference", rec.Reference); err != nil {
		return err
	}
	if rec.TrackingNumber != nil {
		if *rec.TrackingNumber == "" {
			return &datasetError{path: path + ".tracking_number", reason: "must not be empty; use null for a shipment without a tracking number"}
		}
		if err := checkID(path, "tracking_number", *rec.TrackingNumber); err != nil {
			return err
		}
	}
	if rec.OrderID != nil { // absent or null: no link; "" is no order id
		if err := checkID(path, "order_id", *rec.OrderID); err != nil {
			return err
		}
	}
	for i, p := range rec.ParcelTrackingNumbers {
		if err := checkID(path, "parcel_tracking_numbers["+strconv.Itoa(i)+"]", p); err != nil {
			return err
		}
	}
	return nil
}

// prepareShipment reads a shipment's raw events, their after counted from since, normalizes
// them and prepares its view: the shipment, created at createdAt, and its events.
func prepareShipment(path string, rec shipmentRecord, createdAt instant, since time.Time) (*shipment, []stampedEvent, normalization, error) {
	raw, err := readEvents(path, slices.Clone(rec.Events), since) // a copy: a template's records are read by every sandbox made from it
	if err != nil {
		return nil, nil, normalization{}, err
	}
	events, n := normalizeEvents(raw)
	s, err := newShipment(rec, events)
	if err != nil {
		return nil, nil, n, err
	}
	s.dropped, s.createdAt = n.dropped, createdAt
	return s, events, n, nil
}

// readEvents checks a shipment's raw events and reads each one's schedule.
func readEvents(path string, raw []rawEvent, start time.Time) ([]rawEvent, error) {
	for i := range raw {
		epath := path + ".events[" + strconv.Itoa(i) + "]"
		if _, err := oneOf(epath, "status", "tracking status", raw[i].Status, trackingStatuses); err != nil {
			return nil, err
		}
		if raw[i].Description == nil {
			return nil, &datasetError{path: epath + ".description", reason: "required"}
		}
		if err := readAfter(epath, &raw[i], start); err != nil {
			return nil, err
		}
		if ts := raw[i].Timestamp; ts.isString {
			if _, err := parseTimestamp(ts.text); errors.Is(err, errOutOfRFC3339) { // RFC 3339, but an instant none can write: refused, as an after past it is
				return nil, &datasetError{path: epath + ".timestamp", reason: strconv.Quote(ts.text) + " places the event outside the years 0000 to 9999 in UTC, which RFC 3339 cannot write"}
			}
		}
	}
	return raw, nil
}

// ===== A shipment created in a sandbox =====

// A shipment created in a sandbox (POST /v1/test_helpers/shipments): its body is one
// shipment record of the dataset's format, but for what the request decides (its owner,
// and its creation, the request's instant), with an id made for it when none is sent; the
// index's next version holds it beside the others.

// bookingRecord is the body as read: the shipment, and its id when one was sent.
type bookingRecord struct {
	id *string // nil: absent or null, an id is made for it
	shipmentRecord
}

// bookingShape is the members of the body: a shipment's, but account, environment and
// created_at; id may be absent.
var bookingShape = func() recordShape[bookingRecord] {
	var ms []member[bookingRecord]
	for _, m := range shipmentShape.without("account", "environment", "created_at").members {
		if m.name == "id" {
			ms = append(ms, optional("id", func(r *bookingRecord) **string { return &r.id }))
			continue
		}
		ms = append(ms, member[bookingRecord]{m.name, func(d *jsonReader, path, name string, r *bookingRecord) error {
			return m.read(d, path, name, &r.shipmentRecord)
		}})
	}
	return shapeOf(ms...)
}()

var errBookingBody = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object, a shipment such as {"reference":"REF-1","order_id":"ord_1"}.`}

// readBooking reads the body of POST /v1/test_helpers/shipments: its JSON syntax first
// (400), then its members in the order sent (422, named by their path in the body).
func readBooking(b []byte) (*bookingRecord, error) {
	if !oneJSONObject(b) {
		return nil, errBookingBody
	}
	rec := &bookingRecord{}
	d := newJSONReader(bytes.NewReader(b), maxBodyBytes)
	if err := d.document(bookingShape.names, func(name string) error { return bookingShape.member(d, "$", name, rec) }); err != nil {
		var de *datasetError
		if errors.As(err, &de) && de.kind == faultUnknown && bookingDecides[de.path] != "" {
			de.reason = bookingDecides[de.path]
		}
		return nil, bodyFault(err)
	}
	return rec, nil
}

// bookingDecides says why a member a dataset's shipment takes is not the body's.
var bookingDecides = map[string]string{
	"$.created_at":  `a shipment is created at the request's instant (the sandbox's clock, or the request's Prefer: clock="...")`,
	"$.account":     "the shipment belongs to the sandbox of the calling key",
	"$.environment": "the shipment belongs to the sandbox of the calling key",
}

// withBooking is d with the shipment the booking's body asks for, created at the instant at:
// the body read (400, then its members, 422), then the write. A body without an id has made
// for one ("": one is made; an attempt's trace names the one made when it was written).
func (d *tenantData) withBooking(body []byte, at time.Time, made string) (*tenantData, *shipment, error) {
	rec, err := readBooking(body)
	if err != nil {
		return nil, nil, err
	}
	if rec.id == nil && made != "" {
		rec.id = &made
	}
	return d.withShipment(rec, at)
}

// maxSandboxShipments is the most shipments a sandbox holds.
const maxSandboxShipments = 10000

var (
	errAdapterBooking = &apiError{code: codeCapabilityUnavailable, detail: "This sandbox answers as the domain adapter will (profile domain_adapter): booking from an imported order is refused until fulfilment and linkage authority is certified. Create the shipment without order_id, or rehearse the link in a sandbox of the default profile."}
	errDatasetFixed   = &apiError{code: codeCapabilityUnavailable, detail: "A dataset's account is fixed: make a sandbox (POST /v1/test_helpers/sandboxes) and create shipments in it with its keys."}
	errSandboxFull    = &apiError{code: codeCapabilityUnavailable, detail: fmt.Sprintf("This sandbox holds %d shipments, the most a sandbox holds: make another sandbox for more.", maxSandboxShipments)}
)

// withShipment is d with the shipment rec sends, created at the instant at: the next
// version of a sandbox's data (its shipments with one more, its orders built again with one
// more link, its timeline with the shipment's creation), and the shipment; or why there is
// none. The checks come in the dataset's load order: the shipment's ids and numbers, an id
// d holds (422), its events (their after read from at); then the state: a link refused by
// the domain adapter's profile (422), the order it links (404, 409: the orders' rules),
// whether d takes a write (422: a dataset's tenant, or a sandbox of maxSandboxShipments).
// The first write of a sandbox files its orders, which later writes build again.
func (d *tenantData) withShipment(rec *bookingRecord, at time.Time) (*tenantData, *shipment, error) {
	if rec.id != nil {
		rec.ID = *rec.id
	} else {
		rec.ID = "shp_" + randomText(20)
		for d.shipments.find(rec.ID) != nil { // one in 2^100
			rec.ID = "shp_" + randomText(20)
		}
	}
	if err := vetShipment("$", rec.shipmentRecord); err != nil {
		return nil, nil, bodyFault(err)
	}
	if d.shipments.find(rec.ID) != nil {
		return nil, nil, paramError(codeInvalidParameter, "id", fmt.Sprintf("This sandbox holds a shipment %q already (at some instant): send another id, or none to have one made.", rec.ID))
	}
	s, events, _, err := prepareShipment("$", rec.shipmentRecord, instantOf(at), at)
	if err != nil {
		return nil, nil, bodyFault(err)
	}
	if rec.OrderID != nil && d.adapter {
		return nil, nil, errAdapterBooking
	}
	if rec.OrderID != nil {
		if err := d.orders.linkable(*rec.OrderID, at); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case d.source == nil:
		return nil, nil, errDatasetFixed
	case d.shipments.count() >= maxSandboxShipments:
		return nil, nil, errSandboxFull
	}
	next := &tenantData{writes: d.writes + 1, links: d.links, source: d.source, filed: d.filed, adapter: d.adapter}
	if next.filed == nil { // the first write files the orders
		if next.filed, err = d.source.file(d.orders.start); err != nil {
			return nil, nil, err
		}
	}
	if rec.OrderID != nil {
		next.links = append(slices.Clip(d.links), dataLink{*rec.OrderID, rec.ID, s.createdAt, next.writes})
	}
	if next.orders, err = d.ordersWith(next.filed, next.links); err != nil {
		return nil, nil, err
	}
	var happenings []happening
	next.shipments, happenings = d.shipments.with(s, events)
	next.timeline = withHappenings(d.timeline, happenings)
	return next, s, nil
}

// with is the index with one more shipment, s (its events as prepared), created at run
// time: a new index whose list, maps and tree are copies, for the index itself may be read
// by a request that holds its version; and what s schedules, for the timeline. (A shipment
// appended takes the next place: the places the maps hold of the others stay true.)
func (ix *shipmentIndex) with(s *shipment, events []stampedEvent) (shipmentIndex, []happening) {
	next := *ix
	next.list = slices.Clone(ix.list)
	next.byID = maps.Clone(ix.byID)
	next.byTrackingNumber = maps.Clone(ix.byTrackingNumber)
	next.byParcel = maps.Clone(ix.byParcel)
	next.creations = slices.Clone(ix.creations)
	next.happenings = nil
	next.file(s, events)
	next.build()
	happenings := next.happenings
	next.happenings = nil
	return next, happenings
}

// ===== Shipment events: carrier events added to a sandbox's shipment =====

// Carrier events arrive for a sandbox's shipment on demand (POST
// /v1/test_helpers/shipments/{id}/events), so that a test moves a parcel when it chooses:
// raw events in the dataset's format, or the shorthand of one status. They join the
// shipment's stored events by the normalization's rules, as if they had been in its record;
// the index's next version holds the shipment rebuilt at its place, and shares the rest.

// maxPostedEvents is the most events one post sends, and maxShipmentEvents the most a
// shipment stores.
const (
	maxPostedEvents   = 100
	maxShipmentEvents = 1000
)

// shorthandDescriptions are what the shorthand {"status": S} describes its one event as, a
// description for each status of the vocabulary.
var shorthandDescriptions = map[string]string{
	"pre_transit": "Label created", "in_transit": "In transit", "out_for_delivery": "Out for delivery",
	"available_for_pickup": "Available for pickup", "delivered": "Delivered", "return_to_sender": "Returned to sender",
	"failure": "Delivery failed", "cancelled": "Cancelled", "unknown": "Status unknown",
}

// shipmentEventsBody is the body as read: events, or the shorthand's status and location, at the
// request's instant (an event's after counts from it; one with neither a timestamp nor an
// after happens at it); and which of events and status came first.
type shipmentEventsBody struct {
	at       time.Time
	events   []rawEvent
	status   *string
	location *string
	sent     []string // events and status, in the order sent
}

var errShipmentEventsBody = &apiError{code: codeMalformedJSON, detail: `The body must be one JSON object: {"events":[...]} (raw carrier events), or {"status":"delivered"}.`}

// shipmentEventsShape is the members of the body, one row a member, each judged first by its
// value, then (events and status) by being the second of the two: the later is the fault.
var shipmentEventsShape = shapeOf(
	member[shipmentEventsBody]{"events", func(d *jsonReader, path, name string, b *shipmentEventsBody) error {
		if err := readList(d, path+"."+name, &b.events); err != nil {
			return err
		}
		if len(b.events) == 0 || len(b.events) > maxPostedEvents {
			return paramError(codeInvalidParameter, name, fmt.Sprintf("events is a list of 1 to %d raw carrier events, each {\"status\",\"description\",\"location\"} with a timestamp or an after (neither: the request's instant).", maxPostedEvents))
		}
		if _, err := readEvents(path, b.events, b.at); err != nil {
			return err
		}
		return b.one(name)
	}},
	member[shipmentEventsBody]{"status", func(d *jsonReader, path, name string, b *shipmentEventsBody) error {
		v, err := d.str(path, name)
		if err == nil {
			_, err = oneOf(path, name, "tracking status", v, trackingStatuses)
		}
		if err != nil {
			return err
		}
		b.status = &v
		return b.one(name)
	}},
	member[shipmentEventsBody]{"location", func(d *jsonReader, path, name string, b *shipmentEventsBody) (err error) {
		b.location, err = d.optStr(path, name)
		return err
	}},
)

// one notes events or status as sent: the second of the two is a fault.
func (b *shipmentEventsBody) one(name string) error {
	if b.sent = append(b.sent, name); len(b.sent) > 1 {
		return paramError(codeInvalidParameter, name, "Send events (raw carrier events) or status (one event of that status), not both.")
	}
	return nil
}

// readShipmentEvents reads the body of POST /v1/test_helpers/shipments/{id}/events at the
// request's instant at: its JSON syntax (400), then its members in the order sent (422,
// named by their path in the body); and returns the raw events it sends.
func readShipmentEvents(body []byte, at time.Time) ([]rawEvent, error) {
	if !oneJSONObject(body) {
		return nil, errShipmentEventsBody
	}
	b := &shipmentEventsBody{at: at}
	d := newJSONReader(bytes.NewReader(body), maxBodyBytes)
	if err := d.document(shipmentEventsShape.names, func(name string) error { return shipmentEventsShape.member(d, "$", name, b) }); err != nil {
		return nil, bodyFault(err)
	}
	switch {
	case len(b.sent) == 0:
		return nil, paramError(codeInvalidParameter, "events", `Send events (raw carrier events, such as [{"status":"delivered","description":"Delivered","location":"Leeds, GB"}]) or status (one event of that status, such as "delivered").`)
	case b.location != nil && b.status == nil:
		return nil, paramError(codeInvalidParameter, "location", "location goes with status: each of events carries its own.")
	case b.status != nil:
		description := shorthandDescriptions[*b.status]
		return []rawEvent{{Status: *b.status, Description: &description, Location: cmp.Or(b.location, new(string)), scheduled: true, at: at}}, nil
	}
	for i := range b.events { // neither a timestamp nor an after: the request's instant
		if e := &b.events[i]; !e.Timestamp.given && !e.After.given {
			e.scheduled, e.at = true, at
		}
	}
	return b.events, nil
}

var (
	errShipmentEventsUnknown = &apiError{code: codeNotFound, detail: "No shipment with this ID is found in this sandbox at the request's instant: events arrive for a shipment it shows (created by then, and of this account)."}
	errShipmentEventsDataset = &apiError{code: codeCapabilityUnavailable, detail: "A dataset's account is fixed: make a sandbox (POST /v1/test_helpers/sandboxes) and move its shipments with its keys."}
)

// withShipmentEvents is d with the raw events arrived, at the instant at, for the shipment id: the
// next version of a sandbox's data, the shipment rebuilt at its place in a copy of the list
// (the maps, the tree and the orders shared), its timeline with the events that come after
// at; and the shipment. Or why there is none: a shipment not found at at (404), a dataset's
// tenant (422), a shipment past maxShipmentEvents (422).
func (d *tenantData) withShipmentEvents(id string, raw []rawEvent, at time.Time) (*tenantData, *shipment, error) {
	place, ok := d.shipments.byID[id]
	switch {
	case !ok || !d.shipments.list[place].existsAt(at):
		return nil, nil, errShipmentEventsUnknown
	case d.source == nil:
		return nil, nil, errShipmentEventsDataset
	}
	events, _ := normalizeEvents(raw)
	s, err := d.shipments.list[place].withAdded(events)
	if err != nil {
		return nil, nil, err
	}
	next := *d
	next.writes = d.writes + 1
	next.shipments.list = slices.Clone(d.shipments.list)
	next.shipments.list[place] = s
	next.shipments.held += s.bytes() - d.shipments.list[place].bytes()
	var hs []happening
	for _, e := range events {
		if e.at.After(at) {
			hs = append(hs, happening{at: e.at, kind: shipmentEvent, id: id, status: e.Status})
		}
	}
	next.timeline = withHappenings(d.timeline, hs)
	return &next, s, nil
}

// withAdded is s with events (normalized) joined to its stored ones: an event of an instant
// and description s holds is that one; the events stay oldest first, those it held first
// among those of one instant. Past maxShipmentEvents, none is stored.
func (s *shipment) withAdded(events []stampedEvent) (*shipment, error) {
	laid := make([]laidEvent, 0, len(s.instants)+len(events))
	for k := range s.instants {
		laid = append(laid, laidEvent{s.instants[k], s.statuses[k], s.eventJSON(k)})
	}
	held := len(laid)
	for _, e := range events {
		if s.holds(e) {
			continue
		}
		le, err := laidOf(e)
		if err != nil {
			return nil, err
		}
		laid = append(laid, le)
	}
	if len(laid) > maxShipmentEvents {
		return nil, &apiError{code: codeCapabilityUnavailable, detail: fmt.Sprintf("With these events the shipment would hold %d, past the %d a shipment holds: nothing was stored. Move another shipment, or make another sandbox.", len(laid), maxShipmentEvents)}
	}
	merged := make([]laidEvent, 0, len(laid)) // the held and the new, each oldest first (normalized): merged so
	old, fresh := laid[:held], laid[held:]
	for len(old) > 0 && len(fresh) > 0 {
		if fresh[0].at.compare(old[0].at) < 0 {
			merged, fresh = append(merged, fresh[0]), fresh[1:]
		} else {
			merged, old = append(merged, old[0]), old[1:]
		}
	}
	merged = append(append(merged, old...), fresh...)
	return laidShipment(&shipment{id: s.id, trackingNumber: s.trackingNumber, parcels: s.parcels, createdAt: s.createdAt, dropped: s.dropped}, s.prefix(), merged), nil
}

// eventJSON is the JSON of s's k-th event.
func (s *shipment) eventJSON(k int) []byte {
	from := 0
	if k > 0 {
		from = s.ends[k-1] + 1 // past the comma
	}
	return s.events[from:s.ends[k]]
}

// holds reports whether s stores an event of e's instant and description.
func (s *shipment) holds(e stampedEvent) bool {
	at := instantOf(e.at)
	for k := sort.Search(len(s.instants), func(k int) bool { return !at.after(s.instants[k]) }); k < len(s.instants) && s.instants[k] == at; k++ {
		var held trackingEvent
		if json.Unmarshal(s.eventJSON(k), &held) == nil && held.Description == e.Description {
			return true
		}
	}
	return false
}

// ===== The two operations: GET /v1/shipments/{id}/tracking and GET /v1/tracking/{tracking_number} =====

var (
	errShipmentNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this ID exists in this account and environment."}
	errTrackingNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this primary tracking number exists in this account and environment."}
	errTrackingAmbiguous = &apiError{code: codeNotFound, detail: "This tracking number belongs to more than one shipment in this account and environment; look the shipment up by its ID."}
)

// viewByID is GET /v1/shipments/{id}/tracking as the tenant's clock shows it at at: a
// shipment is found from its creation on, and the events after at are not shown yet.
func (ix *shipmentIndex) viewByID(id string, at time.Time) (viewParts, *shipment, error) {
	s := ix.find(id)
	if s == nil || !s.existsAt(at) {
		return viewParts{}, nil, errShipmentNotFound
	}
	return s.viewAt(at), s, nil
}

// viewByNumber is GET /v1/tracking/{tracking_number}: an exact match on the primary
// tracking number of the one shipment of the key's account and environment found at at.
// The shipment is the one shown, or, for a number several hold (errTrackingAmbiguous), the
// first of them.
func (ix *shipmentIndex) viewByNumber(number string, at time.Time) (viewParts, *shipment, error) {
	s, err := ix.holder(number, at)
	if err != nil {
		return viewParts{}, s, err
	}
	return s.viewAt(at), s, nil
}
