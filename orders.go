package main

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	// maxSeedOrders bounds -seed-orders to what fits comfortably in memory (about 550 MiB
	// a million orders).
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
	resource          preparedJSON
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

// loadOrder checks one dataset order.
func loadOrder(path string, rec orderRecord) (*importedOrder, error) {
	for _, f := range []struct{ name, value string }{{"id", rec.ID}, {"merchant_reference", rec.MerchantReference}} {
		if err := required(path, f.name, f.value); err != nil {
			return nil, err
		}
	}
	if err := oneOf(path+".platform", "platform", rec.Platform, platforms); err != nil {
		return nil, err
	}
	if err := oneOf(path+".status", "order status", rec.Status, orderStatuses); err != nil {
		return nil, err
	}
	at, err := timestampField(path+".created_at", rec.CreatedAt)
	if err != nil {
		return nil, err
	}
	return &importedOrder{
		id:                rec.ID,
		createdAt:         at,
		status:            slices.Index(orderStatuses, rec.Status),
		merchantReference: rec.MerchantReference,
		platform:          rec.Platform,
	}, nil
}

// seedOrders makes n deterministic orders for acct_sandbox/test, in list order (newest
// first). Sequence numbers grow with time: ord_seed_0000000 is the oldest. Every status and
// platform occurs (4 and 5 are coprime, so all 20 pairs do), and every fourth order shares
// its created_at with the next, so that the id tie-break is exercised. Seeded orders were
// never imported from a marketplace, so they carry no marketplace token or payload.
func seedOrders(n int) []*importedOrder {
	width := max(7, len(strconv.Itoa(n-1)))
	newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	// Two strings hold every id and every reference, so that they cost no allocation each.
	const idPrefix, refPrefix = "ord_seed_", "SEED-"
	ids := make([]byte, 0, n*(len(idPrefix)+width))
	refs := make([]byte, 0, n*(len(refPrefix)+width))
	for k := range n {
		ids = appendPadded(append(ids, idPrefix...), k, width)
		refs = appendPadded(append(refs, refPrefix...), k, width)
	}
	allIDs, allRefs := string(ids), string(refs)
	idLen, refLen := len(idPrefix)+width, len(refPrefix)+width
	orders := make([]importedOrder, n)
	out := make([]*importedOrder, n)
	for j := range orders {
		k := n - 1 - j // the j-th newest
		orders[j] = importedOrder{
			id:                allIDs[k*idLen : (k+1)*idLen],
			createdAt:         newest.Add(-time.Duration(j-j/4) * 7 * time.Minute),
			status:            k % len(orderStatuses),
			merchantReference: allRefs[k*refLen : (k+1)*refLen],
			platform:          platforms[k%len(platforms)],
		}
		out[j] = &orders[j]
	}
	return out
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

// orderIndex holds a tenant's orders in list order (created_at descending, id descending),
// once in all and once per status, so that any page is found by binary search.
type orderIndex struct {
	byID     map[string]*importedOrder
	all      orderList
	byStatus []orderList // indexed like orderStatuses
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

// join makes the list of orders, whose block is size bytes: each order's bytes as put
// by appendOrder, and a comma.
func join(orders []*importedOrder, size int, appendOrder func([]byte, *importedOrder) []byte) orderList {
	l := orderList{orders: orders, joined: make([]byte, 0, size), starts: make([]int, 0, len(orders)+1)}
	for _, o := range orders {
		l.starts = append(l.starts, len(l.joined))
		l.joined = append(appendOrder(l.joined, o), ',')
	}
	l.starts = append(l.starts, len(l.joined))
	return l
}

// add files an order under the index; build puts the index in order.
func (ix *orderIndex) add(o *importedOrder) {
	ix.byID[o.id] = o
	ix.all.orders = append(ix.all.orders, o)
}

// build sorts the orders added into list order, encodes each order's resource once, into
// the list of all orders (where GET /v1/orders/{id} finds it too), and makes the lists
// per status from those bytes. Seeded orders arrive in list order already, which the sort
// takes in its stride.
func (ix *orderIndex) build() {
	all := ix.all.orders
	slices.SortFunc(all, func(a, b *importedOrder) int {
		if newer(a, b) {
			return -1
		}
		return 1 // ids are unique in a tenant: no two orders are equal
	})
	// Sized first, so that a million orders are not copied over and over by a growing slice.
	// Each order is encoded into scratch and copied: time's AppendFormat writes all nine
	// fraction digits before it trims the zeros, which could outgrow an exact block.
	size := 0
	var scratch []byte
	for _, o := range all {
		scratch = o.appendResource(scratch[:0])
		size += len(scratch) + 1
	}
	ix.all = join(all, size, func(b []byte, o *importedOrder) []byte {
		scratch = o.appendResource(scratch[:0])
		return append(b, scratch...)
	})
	lengths := map[int][]string{} // one Content-Length value for each length
	for i, o := range all {
		body := ix.all.data(i, i+1)
		length := lengths[len(body)]
		if length == nil {
			length = []string{strconv.Itoa(len(body))}
			lengths[len(body)] = length
		}
		o.resource = preparedJSON{body: body[:len(body):len(body)], length: length}
	}
	perStatus := make([][]*importedOrder, len(orderStatuses))
	sizes := make([]int, len(orderStatuses))
	for _, o := range all {
		perStatus[o.status] = append(perStatus[o.status], o)
		sizes[o.status] += len(o.resource.body) + 1
	}
	ix.byStatus = make([]orderList, len(orderStatuses))
	for s, orders := range perStatus {
		ix.byStatus[s] = join(slices.Clip(orders), sizes[s], func(b []byte, o *importedOrder) []byte { return append(b, o.resource.body...) })
	}
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

// queryParam is one name=value pair of a query string, in the order sent.
type queryParam struct{ name, value string }

// splitQuery appends the parameters of a raw query string to params. Names and values
// are percent-decoded, but a literal "+" stays "+": no valid value has a space, while an
// RFC 3339 offset such as +01:00 then needs no escaping.
func splitQuery(params []queryParam, raw string) ([]queryParam, *apiError) {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(pair, "=")
		name, err := url.PathUnescape(rawName)
		if err != nil {
			return nil, paramError(codeUnknownParameter, rawName, "The query has a parameter name that is not percent-encoded correctly.")
		}
		value, err := url.PathUnescape(rawValue)
		if err != nil {
			return nil, paramError(codeInvalidParameter, name, "The value of "+name+" is not percent-encoded correctly.")
		}
		params = append(params, queryParam{name, value})
	}
	return params, nil
}

// noParams wraps an operation that takes no query parameters: any is unknown (422).
func noParams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			params, err := splitQuery(nil, r.URL.RawQuery)
			if err == nil && len(params) > 0 {
				err = unknownParam(params[0].name, "This operation takes no query parameters.")
			}
			if err != nil {
				writeError(w, err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func unknownParam(name, detail string) *apiError {
	return paramError(codeUnknownParameter, name, "Unknown parameter "+strconv.Quote(name)+". "+detail)
}

// listParams are the parameters GET /v1/orders takes.
var listParams = []string{"limit", "cursor", "status", "created_from", "created_to"}

// parseOrderQuery reads the GET /v1/orders query. Faults are reported in the order the
// parameters were sent; the cursor itself is verified later, against the filters.
func parseOrderQuery(raw string) (orderQuery, *apiError) {
	q := orderQuery{limit: defaultPageSize, status: -1}
	var room [8]queryParam // more than a valid query has (one of each of listParams)
	params, perr := splitQuery(room[:0], raw)
	if perr != nil {
		return q, perr
	}
	var seen uint8 // a bit for each parameter of listParams
	for _, p := range params {
		i := slices.Index(listParams, p.name)
		if i < 0 {
			return q, unknownParam(p.name, "GET /v1/orders takes limit, cursor, status, created_from and created_to.")
		}
		if seen&(1<<i) != 0 {
			return q, paramError(codeInvalidParameter, p.name, p.name+" is given more than once; give it once.")
		}
		seen |= 1 << i
		switch p.name {
		case "limit":
			n, ok := parseDigits(p.value, 3)
			if !ok || n < 1 || n > maxPageSize {
				return q, paramError(codeInvalidParameter, "limit", "limit must be a whole number from 1 to 100.")
			}
			q.limit = n
		case "status":
			q.status = slices.Index(orderStatuses, p.value)
			if q.status < 0 {
				return q, paramError(codeInvalidParameter, "status", "status must be one of "+strings.Join(orderStatuses, ", ")+".")
			}
		case "created_from", "created_to":
			t, ok := parseTimestamp(p.value)
			if !ok {
				return q, paramError(codeInvalidParameter, p.name, p.name+" must be an RFC 3339 timestamp with an offset, such as 2026-11-01T09:30:00Z.")
			}
			if p.name == "created_from" {
				q.from, q.hasFrom = t, true
			} else {
				q.to, q.hasTo = t, true
			}
		case "cursor":
			q.cursor, q.hasCursor = p.value, true
		}
	}
	if q.hasFrom && q.hasTo && q.from.After(q.to) {
		return q, paramError(codeInvalidParameter, "created_from", "created_from must not be after created_to.")
	}
	return q, nil
}

// filterTag binds a cursor to the filters of a query: the same instants, however written,
// are the same filter.
func (q *orderQuery) filterTag() tag {
	// status index, then each bound as present, seconds and nanoseconds: a fixed layout.
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
			b = append(b, make([]byte, 13)...)
		}
	}
	return tagOf("orders", string(b))
}

// page finds one page: the list it is taken from, and its orders list.orders[i:j], found
// by a binary search to its start and end. It reports whether more follow.
func (ix *orderIndex) page(q *orderQuery, after *cursorPosition) (list *orderList, i, j int, more bool) {
	list = &ix.all
	if q.status >= 0 {
		list = &ix.byStatus[q.status]
	}
	orders := list.orders
	start, end := 0, len(orders)
	if q.hasTo {
		start = sort.Search(len(orders), func(i int) bool { return !orders[i].createdAt.After(q.to) })
	}
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

var errOrderNotFound = &apiError{code: codeNotFound, detail: "No imported order with this ID exists in this account and environment."}

// handleListOrders answers GET /v1/orders: a page of the tenant's orders, newest first,
// assembled from the orders' prepared bytes.
func (s *server) handleListOrders() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := parseOrderQuery(r.URL.RawQuery)
		if err != nil {
			writeError(w, err)
			return
		}
		t := tenantOf(w)
		var after *cursorPosition
		var filters tag
		if q.hasCursor {
			filters = q.filterTag()
			pos, cerr := s.cursors.verify(q.cursor, t.tag, filters)
			if cerr != nil {
				writeError(w, cerr)
				return
			}
			after = &pos
		}
		list, i, j, more := t.orders.page(&q, after)
		// One buffer and one write: written in parts, the small last part would cost a
		// system call of its own on the connection.
		bp := problemBufs.Get().(*[]byte)
		b := append((*bp)[:0], `{"data":[`...)
		b = append(b, list.data(i, j)...)
		b = append(b, `],"pagination":{"limit":`...)
		b = strconv.AppendInt(b, int64(q.limit), 10)
		if more {
			if !q.hasCursor {
				filters = q.filterTag()
			}
			last := list.orders[j-1]
			b = append(b, `,"next_cursor":"`...)
			b = s.cursors.appendSigned(b, t.tag, filters, cursorPosition{last.createdAt, last.id})
			b = append(b, `","has_more":true}}`...)
		} else {
			b = append(b, `,"next_cursor":null,"has_more":false}}`...)
		}
		writeBody(w, http.StatusOK, jsonContentType, b)
		*bp = b
		problemBufs.Put(bp)
	})
}

// handleGetOrder answers GET /v1/orders/{id}.
func handleGetOrder() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := tenantOf(w).orders.byID[r.PathValue("id")]
		if o == nil {
			writeError(w, errOrderNotFound)
			return
		}
		o.resource.write(w)
	})
}
