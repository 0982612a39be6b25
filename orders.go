// orders.go is imported orders: loading and linking them, their lists in list order, the
// GET /v1/orders query and its pages, and GET /v1/orders/{id}.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
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

// importedOrder is a stored order. Its resource (exactly the spec's six fields: id,
// merchant_reference, platform, status, shipment_id, created_at) is encoded once, when the
// dataset is loaded and its links are made.
type importedOrder struct {
	id                string
	createdAt         time.Time
	status            int // index into orderStatuses
	merchantReference string
	platform          string
	shipmentID        *string
	resource          body
}

// appendResource appends the order as the API shows it. It is written by hand rather than
// with encoding/json because -seed-orders encodes a million orders at start-up; a test
// checks that it matches encoding/json.
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

// orderIndex holds a tenant's orders in list order (created_at descending, id descending),
// once in all and once per status, so that any page is found by binary search.
type orderIndex struct {
	tag      tag // binds cursors to the tenant
	byID     map[string]*importedOrder
	all      orderList
	byStatus []orderList // indexed like orderStatuses
}

func newOrderIndex(owner tag) orderIndex {
	return orderIndex{tag: owner, byID: map[string]*importedOrder{}}
}

// orderList is orders in list order with their resources joined in one block, each
// followed by a comma, so that the data of any page is one slice of the block.
type orderList struct {
	orders []*importedOrder
	joined []byte
	starts []int // where each order's resource starts in joined, then len(joined)
}

// data is the JSON of orders[i:j], comma-separated.
func (l *orderList) data(i, j int) []byte {
	if i == j {
		return nil
	}
	return l.joined[l.starts[i] : l.starts[j]-1]
}

// addOrder checks one dataset order and files it; build puts the index in order.
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
	ix.file(&importedOrder{
		id:                rec.ID,
		createdAt:         at,
		status:            slices.Index(orderStatuses, rec.Status),
		merchantReference: rec.MerchantReference,
		platform:          rec.Platform,
	})
	return nil
}

func (ix *orderIndex) file(o *importedOrder) {
	ix.byID[o.id] = o
	ix.all.orders = append(ix.all.orders, o)
}

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

// seedOrders adds n deterministic orders, in list order (newest first). Sequence numbers grow
// with time: ord_seed_0000000 is the oldest. Every status and platform occurs (4 and 5 are
// coprime, so all 20 pairs do), and every fourth order shares its created_at with the
// next, so that the id tie-break is exercised. Seeded orders were never imported from a
// marketplace, so they carry no marketplace token or payload.
func (ix *orderIndex) seedOrders(n int) error {
	width := max(7, len(strconv.Itoa(n-1)))
	newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	byID := make(map[string]*importedOrder, len(ix.byID)+n)
	for id, o := range ix.byID {
		byID[id] = o
	}
	ix.byID = byID
	ix.all.orders = slices.Grow(ix.all.orders, n)
	orders := make([]importedOrder, n) // one block, not a million allocations
	for j := range orders {
		k := n - 1 - j // the j-th newest
		id := fmt.Sprintf("ord_seed_%0*d", width, k)
		if ix.byID[id] != nil {
			return fmt.Errorf("-seed-orders: order id %q is already in the dataset", id)
		}
		orders[j] = importedOrder{
			id:                id,
			createdAt:         newest.Add(-time.Duration(j-j/4) * 7 * time.Minute),
			status:            k % len(orderStatuses),
			merchantReference: fmt.Sprintf("SEED-%0*d", width, k),
			platform:          platforms[k%len(platforms)],
		}
		ix.file(&orders[j])
	}
	return nil
}

// build sorts the orders filed into list order, encodes each order's resource once, into
// the list of all orders (where GET /v1/orders/{id} finds it too), and makes the lists per
// status from those bytes.
func (ix *orderIndex) build() {
	all := ix.all.orders
	slices.SortFunc(all, func(a, b *importedOrder) int {
		if newer(a, b) {
			return -1
		}
		return 1 // ids are unique in a tenant: no two orders are equal
	})
	ix.all = join(all, func(b []byte, o *importedOrder) []byte { return o.appendResource(b) })
	lengths := map[int][]string{} // one Content-Length value for each length, not one an order
	for i, o := range all {
		b := ix.all.data(i, i+1)
		if lengths[len(b)] == nil {
			lengths[len(b)] = []string{strconv.Itoa(len(b))}
		}
		o.resource = body{b[:len(b):len(b)], lengths[len(b)]}
	}
	perStatus := make([][]*importedOrder, len(orderStatuses))
	for _, o := range all {
		perStatus[o.status] = append(perStatus[o.status], o)
	}
	ix.byStatus = make([]orderList, len(orderStatuses))
	for s, orders := range perStatus {
		ix.byStatus[s] = join(orders, func(b []byte, o *importedOrder) []byte { return append(b, o.resource.bytes...) })
	}
}

// join makes the list of orders: each order's bytes as put by appendOrder, and a comma.
func join(orders []*importedOrder, appendOrder func([]byte, *importedOrder) []byte) orderList {
	l := orderList{orders: orders, starts: make([]int, 0, len(orders)+1)}
	for _, o := range orders {
		l.starts = append(l.starts, len(l.joined))
		l.joined = append(appendOrder(l.joined, o), ',')
	}
	l.starts = append(l.starts, len(l.joined))
	l.joined = slices.Clip(l.joined)
	return l
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

// page finds one page as the tenant's clock shows the orders at at (those created at or
// before it): the list it is taken from, and its orders list.orders[i:j], found by a binary
// search to its start and end. It reports whether more follow.
func (ix *orderIndex) page(q *orderQuery, after *cursorPosition, at time.Time) (list *orderList, i, j int, more bool) {
	list = &ix.all
	if q.status >= 0 {
		list = &ix.byStatus[q.status]
	}
	orders := list.orders
	to := at // the clock bounds every list as created_to would
	if q.hasTo && q.to.Before(at) {
		to = q.to
	}
	start := sort.Search(len(orders), func(i int) bool { return !orders[i].createdAt.After(to) })
	end := len(orders)
	if after != nil {
		start = max(start, sort.Search(len(orders), func(i int) bool {
			c := orders[i].createdAt.Compare(after.createdAt)
			return c < 0 || (c == 0 && orders[i].id < after.id)
		}))
	}
	if q.hasFrom {
		end = sort.Search(len(orders), func(i int) bool { return orders[i].createdAt.Before(q.from) })
	}
	if start >= end {
		return list, 0, 0, false
	}
	n := min(q.limit, end-start)
	return list, start, start + n, end-start > n
}

// visible are the orders the clock shows at at, newest first.
func (ix *orderIndex) visible(at time.Time) []*importedOrder {
	orders := ix.all.orders
	return orders[sort.Search(len(orders), func(i int) bool { return !orders[i].createdAt.After(at) }):]
}

var errOrderNotFound = &apiError{code: codeNotFound, detail: "No imported order with this ID exists in this account and environment."}

// serveGet answers GET /v1/orders/{id}: an order created after at does not exist yet.
func (ix *orderIndex) serveGet(w http.ResponseWriter, r *http.Request, at time.Time) error {
	o := ix.byID[r.PathValue("id")]
	if o == nil || o.createdAt.After(at) {
		return errOrderNotFound
	}
	writeBody(w, http.StatusOK, jsonContentType, o.resource.length, o.resource.bytes)
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
	list, i, j, more := ix.page(&q, after, at)
	buf := ls.pages.Get().(*[]byte)
	defer ls.pages.Put(buf)
	b := append((*buf)[:0], `{"data":[`...)
	b = append(b, list.data(i, j)...)
	b = append(b, `],"pagination":{"limit":`...)
	b = strconv.AppendInt(b, int64(q.limit), 10)
	if more {
		last := list.orders[j-1]
		b = append(b, `,"next_cursor":"`...)
		b = ls.cursors.appendSigned(b, ix.tag, filters, cursorPosition{last.createdAt, last.id})
		b = append(b, `","has_more":true}}`...)
	} else {
		b = append(b, `,"next_cursor":null,"has_more":false}}`...)
	}
	*buf = b
	writeBody(w, http.StatusOK, jsonContentType, []string{strconv.Itoa(len(b))}, b)
	return nil
}
