// orders.go is imported orders: loading and linking them, their lists in list order, the
// GET /v1/orders query and its pages, and GET /v1/orders/{id}.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Imported-order vocabularies.
var (
	orderStatuses = []string{"unfulfilled", "partially_fulfilled", "fulfilled", "cancelled"}
	platforms     = []string{"amazon", "ebay", "etsy", "shopify", "tiktok_shop"}
)

const (
	defaultPageSize = 20
	maxPageSize     = 100
	// maxSeedOrders bounds -seed-orders to what fits comfortably in memory.
	maxSeedOrders = 5_000_000
)

// orderRecord is an imported order as the dataset holds it. A dataset may give the
// marketplace token and the raw marketplace payload, as imported orders carry them; the
// API never shows them, so the sandbox does not keep them.
type orderRecord struct {
	ID                 string          `json:"id"`
	Account            string          `json:"account"`
	Environment        string          `json:"environment"`
	MerchantReference  string          `json:"merchant_reference"`
	Platform           string          `json:"platform"`
	Status             string          `json:"status"`
	CreatedAt          string          `json:"created_at"`
	MarketplaceToken   string          `json:"marketplace_token"`
	RawMarketplaceData json.RawMessage `json:"raw_marketplace_data"`
}

// importedOrder is an order as the dataset gives it, kept while the dataset loads; build
// stores it as a record and its resource's bytes.
type importedOrder struct {
	id                string
	createdAt         time.Time
	status            int // index into orderStatuses
	merchantReference string
	platform          string
	shipmentID        *string
}

// appendResource appends the order as the API shows it (exactly the spec's six fields: id,
// merchant_reference, platform, status, shipment_id, created_at). It is written by hand
// rather than with encoding/json because -seed-orders encodes a million orders at start-up;
// a test checks that it matches encoding/json.
func (o *importedOrder) appendResource(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, o.id)
	b = append(b, `,"merchant_reference":`...)
	b = appendJSONString(b, o.merchantReference)
	b = append(b, `,"platform":`...)
	b = appendJSONString(b, o.platform)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, orderStatuses[o.status])
	b = append(b, `,"shipment_id":`...)
	if o.shipmentID == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, *o.shipmentID)
	}
	b = append(b, `,"created_at":"`...)
	b = o.createdAt.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// newer reports whether a comes before b in a list: created_at descending, then id descending.
func newer(a, b *importedOrder) bool {
	if c := a.createdAt.Compare(b.createdAt); c != 0 {
		return c > 0
	}
	return a.id > b.id
}

// orderIndex holds a tenant's orders in list order (created_at descending, id descending)
// in storage the garbage collector need not walk: every order's JSON in one block, a
// fixed-size record per order, the lists per status as indexes, and the ids in an
// open-addressing table of indexes. No part of it holds a pointer per order.
type orderIndex struct {
	tag      tag // binds cursors to the tenant
	pending  []*importedOrder
	byID     map[string]*importedOrder // while loading: the dataset's orders
	seeds    int                       // -seed-orders, generated at build
	records  []storedOrder             // in list order
	bytes    []byte                    // each order's JSON in list order, each followed by a comma
	ids      []byte                    // each order's id, in list order
	byStatus [][]int32                 // indexes into records, per status, in list order
	table    idTable
	lengths  map[int][]string // one Content-Length value for each length an order has
	links    map[int32]string // the shipment each linked order (by record index) is linked to
}

// storedOrder is one order's record: where its JSON and id are, its created_at, its status.
type storedOrder struct {
	sec    int64  // created_at: seconds since 1970 (negative before)
	off    uint32 // where its JSON starts in bytes; it ends a comma before the next's
	nsec   int32
	idOff  uint32 // where its id starts in ids
	idLen  uint8
	status uint8
}

func newOrderIndex(owner tag) orderIndex {
	return orderIndex{tag: owner, byID: map[string]*importedOrder{}}
}

// addOrder checks one dataset order and keeps it for build.
func (ix *orderIndex) addOrder(path, where string, rec orderRecord) error {
	for _, f := range []struct{ name, value string }{{"id", rec.ID}, {"merchant_reference", rec.MerchantReference}} {
		if err := checkID(path+"."+f.name, f.value); err != nil {
			return err
		}
	}
	if err := oneOf(path+".platform", "platform", rec.Platform, platforms); err != nil {
		return err
	}
	if err := oneOf(path+".status", "order status", rec.Status, orderStatuses); err != nil {
		return err
	}
	at, err := timestampField(path+".created_at", rec.CreatedAt)
	if err != nil {
		return err
	}
	if ix.byID[rec.ID] != nil {
		return &datasetError{path: path + ".id", reason: fmt.Sprintf("duplicate order id %q in %s", rec.ID, where)}
	}
	o := &importedOrder{id: rec.ID, createdAt: at, status: slices.Index(orderStatuses, rec.Status), merchantReference: rec.MerchantReference, platform: rec.Platform}
	ix.byID[o.id] = o
	ix.pending = append(ix.pending, o)
	return nil
}

// has reports whether the dataset gives an order of this id.
func (ix *orderIndex) has(id string) bool { return ix.byID[id] != nil }

// link records that the shipment shipmentID was created with the order orderID: the
// order's shipment_id. One order can be linked once (a second link is the API's 409).
func (ix *orderIndex) link(path, where, orderID, shipmentID string) error {
	o := ix.byID[orderID]
	if o == nil {
		return &datasetError{path: path, reason: fmt.Sprintf("no order %q in %s to link shipment %q to", orderID, where, shipmentID)}
	}
	if o.shipmentID != nil {
		return &datasetError{path: path, reason: fmt.Sprintf("order %q is already linked to shipment %q; linking it to shipment %q too is a conflict (409)", orderID, *o.shipmentID, shipmentID)}
	}
	o.shipmentID = &shipmentID
	return nil
}

// seedOrders asks build for n deterministic orders. Sequence numbers grow with time:
// ord_seed_0000000 is the oldest, created 7 minutes before the next, but that every fourth
// shares its created_at with the next (so the id tie-break is exercised); the newest is
// created 2026-10-31T23:00:00Z. Every status and platform occurs (4 and 5 are coprime, so
// all 20 pairs do). Seeded orders carry no marketplace token or payload.
func (ix *orderIndex) seedOrders(n int) error {
	for id := range ix.byID {
		if k, ok := seedNumber(id, n); ok && k < n {
			return fmt.Errorf("-seed-orders: order id %q is already in the dataset", id)
		}
	}
	ix.seeds = n
	return nil
}

// seededOrder is the j-th newest of n seeded orders, in scratch (reused: nothing of it is
// kept but the bytes build writes).
func seededOrder(scratch *importedOrder, idBuf, refBuf []byte, j, n int) {
	width := seedWidth(n)
	k := n - 1 - j
	newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	*scratch = importedOrder{
		id:                string(appendPadded(append(idBuf[:0], "ord_seed_"...), k, width)),
		createdAt:         newest.Add(-time.Duration(j-j/4) * 7 * time.Minute),
		status:            k % len(orderStatuses),
		merchantReference: string(appendPadded(append(refBuf[:0], "SEED-"...), k, width)),
		platform:          platforms[k%len(platforms)],
	}
}

func seedWidth(n int) int { return max(7, len(strconv.Itoa(n-1))) }

// seedNumber reads k from an id ord_seed_<k> as n seeded orders write it.
func seedNumber(id string, n int) (int, bool) {
	digits, ok := strings.CutPrefix(id, "ord_seed_")
	if !ok || len(digits) != seedWidth(n) {
		return 0, false
	}
	return parseWhole(digits, n)
}

// appendPadded appends n in decimal, zero-padded to width digits.
func appendPadded(b []byte, n, width int) []byte {
	var d [20]byte
	s := strconv.AppendInt(d[:0], int64(n), 10)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// build stores the dataset's orders and the seeded ones in list order. Seeded orders are
// made newest first and merged with the dataset's, so that a million are written straight
// into the block, with no allocation each.
func (ix *orderIndex) build() error {
	slices.SortFunc(ix.pending, func(a, b *importedOrder) int {
		if newer(a, b) {
			return -1
		}
		return 1 // ids are unique in a tenant: no two orders are equal
	})
	n := len(ix.pending) + ix.seeds
	ix.records = make([]storedOrder, 0, n)
	ix.bytes = make([]byte, 0, n*180)
	ix.ids = make([]byte, 0, n*16)
	ix.byStatus = make([][]int32, len(orderStatuses))
	ix.lengths = map[int][]string{}
	ix.links = map[int32]string{}
	var seed importedOrder
	var idBuf, refBuf [32]byte
	j := 0 // the next seeded order, newest first
	if ix.seeds > 0 {
		seededOrder(&seed, idBuf[:], refBuf[:], 0, ix.seeds)
	}
	for p := 0; p < len(ix.pending) || j < ix.seeds; {
		if j == ix.seeds || p < len(ix.pending) && newer(ix.pending[p], &seed) {
			if err := ix.store(ix.pending[p]); err != nil {
				return err
			}
			p++
			continue
		}
		if err := ix.store(&seed); err != nil {
			return err
		}
		if j++; j < ix.seeds {
			seededOrder(&seed, idBuf[:], refBuf[:], j, ix.seeds)
		}
	}
	ix.pending, ix.byID = nil, nil
	ix.table = newIDTable(ix)
	return nil
}

// store appends one order, the next in list order.
func (ix *orderIndex) store(o *importedOrder) error {
	start := len(ix.bytes)
	ix.bytes = append(o.appendResource(ix.bytes), ',')
	if len(ix.bytes) > math.MaxUint32 || len(ix.records) >= math.MaxInt32 {
		return errors.New("the orders of one account and environment exceed 4 GiB of JSON")
	}
	i := int32(len(ix.records))
	ix.records = append(ix.records, storedOrder{sec: o.createdAt.Unix(), nsec: int32(o.createdAt.Nanosecond()), off: uint32(start),
		idOff: uint32(len(ix.ids)), idLen: uint8(len(o.id)), status: uint8(o.status)})
	ix.ids = append(ix.ids, o.id...)
	ix.byStatus[o.status] = append(ix.byStatus[o.status], i)
	if o.shipmentID != nil {
		ix.links[i] = *o.shipmentID
	}
	if size := len(ix.bytes) - 1 - start; ix.lengths[size] == nil {
		ix.lengths[size] = []string{strconv.Itoa(size)}
	}
	return nil
}

// count is how many orders the tenant has.
func (ix *orderIndex) count() int { return len(ix.records) }

// resource is the JSON of order i.
func (ix *orderIndex) resource(i int) []byte {
	return ix.bytes[ix.records[i].off:ix.end(i)]
}

// end is where order i's JSON ends in bytes.
func (ix *orderIndex) end(i int) int {
	if i+1 < len(ix.records) {
		return int(ix.records[i+1].off) - 1
	}
	return len(ix.bytes) - 1
}

// id is order i's id.
func (ix *orderIndex) id(i int) []byte {
	r := &ix.records[i]
	return ix.ids[r.idOff : r.idOff+uint32(r.idLen)]
}

// createdAt is order i's created_at.
func (ix *orderIndex) createdAt(i int) time.Time {
	return time.Unix(ix.records[i].sec, int64(ix.records[i].nsec)).UTC()
}

// after reports whether order i was created after at.
func (ix *orderIndex) after(i int, at time.Time) bool {
	r := &ix.records[i]
	return r.sec > at.Unix() || r.sec == at.Unix() && r.nsec > int32(at.Nanosecond())
}

// idTable finds an order by its id: open addressing over slots holding index+1 (0 is
// empty), so that a million ids cost four bytes each and nothing for the collector.
type idTable struct {
	seed  maphash.Seed
	slots []int32
}

func newIDTable(ix *orderIndex) idTable {
	size := 16
	for size < 2*len(ix.records) {
		size *= 2
	}
	t := idTable{seed: maphash.MakeSeed(), slots: make([]int32, size)}
	for i := range ix.records {
		h := int(maphash.Bytes(t.seed, ix.id(i)) & uint64(size-1))
		for t.slots[h] != 0 {
			h = (h + 1) & (size - 1)
		}
		t.slots[h] = int32(i + 1)
	}
	return t
}

// find is the index of the order with this id, or -1.
func (t *idTable) find(ix *orderIndex, id string) int {
	if len(t.slots) == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for h := int(maphash.String(t.seed, id) & uint64(mask)); t.slots[h] != 0; h = (h + 1) & mask {
		if i := int(t.slots[h] - 1); string(ix.id(i)) == id {
			return i
		}
	}
	return -1
}

// orderQuery is a parsed GET /v1/orders query.
type orderQuery struct {
	limit          int
	status         int // index into orderStatuses, -1 for any
	from, to       time.Time
	hasFrom, hasTo bool
	cursor         string
	hasCursor      bool
}

// listParams are the parameters GET /v1/orders takes.
var listParams = []string{"limit", "cursor", "status", "created_from", "created_to"}

// queryParam is one name=value pair of a query, its name decoded; a name that cannot be
// decoded is kept as sent (and is then no parameter's name).
type queryParam struct {
	name, rawValue string
}

// value is the pair's value, decoded. A literal "+" is a space, as every HTTP client and
// HTML form writes it: an offset is sent as %2B01:00 (or the instant in Z).
func (p queryParam) value() (string, error) {
	v, err := url.QueryUnescape(p.rawValue)
	if err != nil {
		return "", paramError(codeInvalidParameter, p.name, "The value of "+p.name+" is not percent-encoded correctly.")
	}
	return v, nil
}

// nextParam takes the first name=value pair off a raw query; empty pairs (a&&b) are
// skipped, and ok is false when none is left.
func nextParam(raw string) (p queryParam, rest string, ok bool) {
	var pair string
	for pair == "" {
		if raw == "" {
			return p, "", false
		}
		pair, raw, _ = strings.Cut(raw, "&")
	}
	rawName, rawValue, _ := strings.Cut(pair, "=")
	name, err := url.QueryUnescape(rawName)
	if err != nil {
		name = rawName
	}
	return queryParam{name, rawValue}, raw, true
}

func unknownParam(name, detail string) error {
	return paramError(codeUnknownParameter, name, "Unknown parameter "+strconv.Quote(name)+". "+detail)
}

// refuseParams is the query check of an operation that takes no query parameters.
func refuseParams(raw string) error {
	if p, _, ok := nextParam(raw); ok {
		return unknownParam(p.name, "This operation takes no query parameters.")
	}
	return nil
}

// parseOrderQuery reads the GET /v1/orders query. Faults are reported in the order the
// parameters were sent, each pair judged by its name, then by its value; the cursor itself
// is verified later, against the filters.
func parseOrderQuery(raw string) (orderQuery, error) {
	q := orderQuery{limit: defaultPageSize, status: -1}
	var seen [5]bool // indexed like listParams
	for p, rest, ok := nextParam(raw); ok; p, rest, ok = nextParam(rest) {
		i := slices.Index(listParams, p.name)
		if i < 0 {
			return q, unknownParam(p.name, "GET /v1/orders takes limit, cursor, status, created_from and created_to.")
		}
		if seen[i] {
			return q, paramError(codeInvalidParameter, p.name, p.name+" is given more than once; give it once.")
		}
		seen[i] = true
		value, err := p.value()
		if err != nil {
			return q, err
		}
		if err := q.set(p.name, value); err != nil {
			return q, err
		}
	}
	if q.hasFrom && q.hasTo && q.from.After(q.to) {
		return q, paramError(codeInvalidParameter, "created_from", "created_from must not be after created_to.")
	}
	return q, nil
}

// set takes one parameter's value.
func (q *orderQuery) set(name, value string) error {
	switch name {
	case "limit":
		n, ok := parseWhole(value, maxPageSize)
		if !ok || n < 1 {
			return paramError(codeInvalidParameter, "limit", "limit must be a whole number from 1 to 100.")
		}
		q.limit = n
	case "status":
		if q.status = slices.Index(orderStatuses, value); q.status < 0 {
			return paramError(codeInvalidParameter, "status", "status must be one of "+strings.Join(orderStatuses, ", ")+".")
		}
	case "created_from", "created_to":
		t, err := parseTimestamp(value)
		if _, plus := parseTimestamp(strings.Replace(value, " ", "+", 1)); err != nil && plus == nil {
			return paramError(codeInvalidParameter, name, "The value of "+name+" has a space where its offset's + should be: a query reads a literal + as a space. Send the + as %2B (such as 2026-11-01T00:00:00%2B01:00), or give the instant in Z.")
		}
		if err != nil {
			return paramError(codeInvalidParameter, name, "The value of "+name+" "+err.Error()+".")
		}
		if name == "created_from" {
			q.from, q.hasFrom = t, true
		} else {
			q.to, q.hasTo = t, true
		}
	case "cursor":
		q.cursor, q.hasCursor = value, true
	}
	return nil
}

// filterTag binds a cursor to the filters of a query: the same instants, however written,
// are the same filter.
func (q *orderQuery) filterTag() tag {
	var buf [1 + 2*13]byte
	b := append(buf[:0], byte(q.status+1))
	for _, bound := range []struct {
		set bool
		at  time.Time
	}{{q.hasFrom, q.from}, {q.hasTo, q.to}} {
		if bound.set {
			b = append(b, 1)
			b = binary.BigEndian.AppendUint64(b, uint64(bound.at.Unix()))
			b = binary.BigEndian.AppendUint32(b, uint32(bound.at.Nanosecond()))
		} else {
			b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
		}
	}
	return tagOf("orders", string(b))
}

// orderPage is one page of a list: the orders at positions i to j of the list of all
// orders, or of one status's list.
type orderPage struct {
	status int // -1: the list of all orders
	i, j   int
	more   bool
}

// index is the record index of the order at position k of the page's list.
func (ix *orderIndex) index(status, k int) int {
	if status < 0 {
		return k
	}
	return int(ix.byStatus[status][k])
}

// page finds one page as the tenant's clock shows the orders at at (those created at or
// before it), by a binary search to its start and end in the list it is taken from. It
// reports whether more follow.
func (ix *orderIndex) page(q *orderQuery, after *cursorPosition, at time.Time) orderPage {
	n := len(ix.records)
	if q.status >= 0 {
		n = len(ix.byStatus[q.status])
	}
	order := func(k int) int { return ix.index(q.status, k) }
	to := at // the clock bounds every list as created_to would
	if q.hasTo && q.to.Before(at) {
		to = q.to
	}
	start := sort.Search(n, func(k int) bool { return !ix.after(order(k), to) })
	end := n
	if after != nil {
		start = max(start, sort.Search(n, func(k int) bool {
			i := order(k)
			c := ix.createdAt(i).Compare(after.createdAt)
			return c < 0 || (c == 0 && string(ix.id(i)) < after.id)
		}))
	}
	if q.hasFrom {
		end = sort.Search(n, func(k int) bool { return ix.createdAt(order(k)).Before(q.from) })
	}
	if start >= end {
		return orderPage{status: q.status}
	}
	count := min(q.limit, end-start)
	return orderPage{q.status, start, start + count, end-start > count}
}

// appendData appends the page's orders' JSON, comma-separated: one slice of the block for
// the list of all orders, one copy per order for a status's list.
func (ix *orderIndex) appendData(b []byte, pg orderPage) []byte {
	if pg.i == pg.j {
		return b
	}
	if pg.status < 0 {
		return append(b, ix.bytes[ix.records[pg.i].off:ix.end(pg.j-1)]...)
	}
	for k := pg.i; k < pg.j; k++ {
		if k > pg.i {
			b = append(b, ',')
		}
		b = append(b, ix.resource(ix.index(pg.status, k))...)
	}
	return b
}

// visible is the position of the newest order the clock shows at at: those before it are
// not created yet.
func (ix *orderIndex) visible(at time.Time) int {
	return sort.Search(len(ix.records), func(i int) bool { return !ix.after(i, at) })
}

// listedOrder is an order as a list shows it at an instant.
type listedOrder struct {
	id, status, shipmentID string // shipmentID "" for none
	createdAt              time.Time
}

// firstListed is the first n orders GET /v1/orders lists at at, and how many more it does.
func (ix *orderIndex) firstListed(at time.Time, n int) ([]listedOrder, int) {
	first := ix.visible(at)
	var orders []listedOrder
	for i := first; i < min(len(ix.records), first+n); i++ {
		orders = append(orders, listedOrder{string(ix.id(i)), orderStatuses[ix.records[i].status], ix.links[int32(i)], ix.createdAt(i)})
	}
	return orders, len(ix.records) - first - len(orders)
}

var errOrderNotFound = &apiError{code: codeNotFound, detail: "No imported order with this ID exists in this account and environment."}

// serveGet answers GET /v1/orders/{id}: an order created after at does not exist yet.
func (ix *orderIndex) serveGet(w http.ResponseWriter, r *http.Request, at time.Time) error {
	i := ix.table.find(ix, r.PathValue("id"))
	if i < 0 || ix.after(i, at) {
		return errOrderNotFound
	}
	b := ix.resource(i)
	writeBody(w, http.StatusOK, jsonContentType, ix.lengths[len(b)], b)
	return nil
}

// orderLister answers GET /v1/orders for every tenant: a page of the tenant's orders,
// newest first, assembled from the orders' prepared bytes. A page (up to 100 orders, some
// 16 KiB) is assembled in a pooled buffer and written in one write.
type orderLister struct {
	cursors *cursorSigner
	pages   sync.Pool // of *[]byte
}

func newOrderLister(cursors *cursorSigner) *orderLister {
	return &orderLister{cursors: cursors, pages: sync.Pool{New: func() any { return new([]byte) }}}
}

func (ls *orderLister) serveList(w http.ResponseWriter, r *http.Request, ix *orderIndex, at time.Time) error {
	q, err := parseOrderQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	filters := q.filterTag()
	var after *cursorPosition
	if q.hasCursor {
		pos, err := ls.cursors.verify(q.cursor, ix.tag, filters)
		if err != nil {
			return err
		}
		after = &pos
	}
	pg := ix.page(&q, after, at)
	buf := ls.pages.Get().(*[]byte)
	defer ls.pages.Put(buf)
	b := append((*buf)[:0], `{"data":[`...)
	b = ix.appendData(b, pg)
	b = append(b, `],"pagination":{"limit":`...)
	b = strconv.AppendInt(b, int64(q.limit), 10)
	if pg.more {
		last := ix.index(pg.status, pg.j-1)
		b = append(b, `,"next_cursor":"`...)
		b = ls.cursors.appendSigned(b, ix.tag, filters, ix.createdAt(last), ix.id(last))
		b = append(b, `","has_more":true}}`...)
	} else {
		b = append(b, `,"next_cursor":null,"has_more":false}}`...)
	}
	*buf = b
	writeBody(w, http.StatusOK, jsonContentType, []string{strconv.Itoa(len(b))}, b)
	return nil
}
