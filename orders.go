// orders.go is imported orders: loading and linking them, their timelines (a late import,
// status changes, a link that appears), the index that keeps them in list order, the GET
// /v1/orders query and its pages, GET /v1/orders/{id}, and what a page showed as the
// journal's findings judge it. Its sections (grep '^// =====' *.go):
//
//   - Vocabularies
//   - Loading: orders on their way in
//   - A sandbox's orders: filed once, built again with each write's link
//   - The index: orders in list order
//   - The query of GET /v1/orders
//   - Pages: what a list shows at an instant
//   - The two operations: GET /v1/orders/{id} and GET /v1/orders
//   - What a page showed, as the findings judge it
//   - Which pages held an order's place
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// ===== Vocabularies =====

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

// ===== Loading: orders on their way in =====

// Orders on their way in. A dataset's orders are read into orderRecords, then checked and
// filed under their tenants as pendingOrders, then build stores each tenant's in list
// order. None of these holds a pointer per order, so that a million of them cost the
// collector nothing to walk while they load.

// orderRecords are a dataset's orders as read: every order's own strings one after another
// in text, each value that repeats across orders (an account, a platform, a status) once in
// values, a fixed-size record per order, and every order's changes.
type orderRecords struct {
	text    []byte
	values  []string          // values[0] is "": a member absent or null
	valueOf map[string]uint32 // the index of each value
	list    []orderRecord
	changes []changeRecord
}

// span is a string of orderRecords.text.
type span struct{ off, n uint32 }

// orderRecord is an imported order as the dataset holds it. A dataset may give the
// marketplace token and the raw marketplace payload, as imported orders carry them; the
// API never shows them, so they are read and nothing of them is kept. Its instants may be
// relative to the start instant; imported_at and changes schedule what moves.
//
// A new field of the resource touches these places, each for a reason of its own:
//   - orderRecord, here, and orderShape below: the member a dataset gives, read strictly
//     and kept as a span of the records' text (or a value kept once, if it repeats);
//   - addOrder: its check, with the JSON path of a fault, as every member's;
//   - pendingOrder and loadingOrder, with loadingOf and seededOrder that fill them: what is
//     carried to build, where every order is stored in list order (seeded ones made there);
//   - appendResource: the resource's JSON, written by hand once at load (a million orders),
//     and orderState too if the field changes with the clock;
//   - openapi.json's ImportedOrder, and docs/api.md's list of the fields: what clients read;
//   - TestResourcesAreWrittenAsSpecified: the six fields of the spec, in order, held to
//     what encoding/json writes of them (a seventh fails it until the spec says so).
type orderRecord struct {
	id, reference, createdAt, importedAt   span
	account, environment, platform, status uint32 // indexes into values
	imported                               bool   // imported_at is given (not null)
	firstChange, endChange                 uint32 // its changes
}

// changeRecord is one change of an order's status, as the dataset holds it.
type changeRecord struct {
	status uint32 // an index into values
	at     span
}

func newOrderRecords() *orderRecords {
	return &orderRecords{values: []string{""}, valueOf: map[string]uint32{"": 0}}
}

func (rs *orderRecords) textOf(s span) []byte { return rs.text[s.off : s.off+s.n] }

func (rs *orderRecords) str(s span) string { return string(rs.textOf(s)) }

// keep keeps b, an order's own string.
func (rs *orderRecords) keep(b []byte) span {
	rs.text = append(rs.text, b...)
	return span{uint32(len(rs.text) - len(b)), uint32(len(b))}
}

// value keeps b, a value that repeats, once.
func (rs *orderRecords) value(b []byte) uint32 {
	if i, ok := rs.valueOf[string(b)]; ok {
		return i
	}
	rs.values = append(rs.values, string(b))
	rs.valueOf[rs.values[len(rs.values)-1]] = uint32(len(rs.values) - 1)
	return uint32(len(rs.values) - 1)
}

// orderShape is the members of an order record: its own strings kept in the records' text,
// the values that repeat kept once, and marketplace_token and raw_marketplace_data read (a
// string, and any JSON) and not kept.
var orderShape = shapeOf(
	kept("id", func(o *orderRecord) *span { return &o.id }, (*orderRecords).keep),
	kept("account", func(o *orderRecord) *uint32 { return &o.account }, (*orderRecords).value),
	kept("environment", func(o *orderRecord) *uint32 { return &o.environment }, (*orderRecords).value),
	kept("merchant_reference", func(o *orderRecord) *span { return &o.reference }, (*orderRecords).keep),
	kept("platform", func(o *orderRecord) *uint32 { return &o.platform }, (*orderRecords).value),
	kept("status", func(o *orderRecord) *uint32 { return &o.status }, (*orderRecords).value),
	kept("created_at", func(o *orderRecord) *span { return &o.createdAt }, (*orderRecords).keep),
	member[orderReading]{"imported_at", readImportedAt},
	member[orderReading]{"changes", readChanges},
	member[orderReading]{"marketplace_token", func(d *jsonReader, path, name string, _ *orderReading) error {
		_, err := d.strBytes(path, name)
		return err
	}},
	member[orderReading]{"raw_marketplace_data", func(d *jsonReader, path, name string, _ *orderReading) error {
		return d.skip(path + "." + name)
	}},
)

// changeShape is the members of a change of an order's status.
var changeShape = shapeOf(
	kept("status", func(c *changeRecord) *uint32 { return &c.status }, (*orderRecords).value),
	kept("at", func(c *changeRecord) *span { return &c.at }, (*orderRecords).keep),
)

// bodyOrderShape is an order's members as a request body sends it: its owner is the
// sandbox that holds it.
var bodyOrderShape = orderShape.without("account", "environment")

// readOrders reads a list of orders at path, each of the members shape takes: orderShape
// in a dataset, bodyOrderShape in a request body.
func (rs *orderRecords) readOrders(d *jsonReader, path string, shape *recordShape[orderReading]) error {
	return d.array(path, func(i int) error {
		rec := orderRecord{firstChange: uint32(len(rs.changes)), endChange: uint32(len(rs.changes))}
		err := shape.read(d, path+"["+strconv.Itoa(i)+"]", &orderReading{rs, &rec})
		rs.list = append(rs.list, rec)
		return err
	})
}

// bytes is about what the records hold on the heap.
func (rs *orderRecords) bytes() int64 {
	n := len(rs.text) + len(rs.list)*int(unsafe.Sizeof(orderRecord{})) + len(rs.changes)*int(unsafe.Sizeof(changeRecord{}))
	for _, v := range rs.values {
		n += len(v) + 32 // and its place in valueOf
	}
	return int64(n)
}

// copyOf is the records of the orders at these indexes, apart from the rest: what a dataset
// keeps of a tenant's orders for its sandboxes to copy.
func (rs *orderRecords) copyOf(indexes []int32) *orderRecords {
	c := newOrderRecords()
	value := func(v uint32) uint32 { return c.value([]byte(rs.values[v])) }
	for _, i := range indexes {
		r := &rs.list[i]
		n := orderRecord{id: c.keep(rs.textOf(r.id)), reference: c.keep(rs.textOf(r.reference)), createdAt: c.keep(rs.textOf(r.createdAt)),
			importedAt: c.keep(rs.textOf(r.importedAt)), account: value(r.account), environment: value(r.environment), platform: value(r.platform),
			status: value(r.status), imported: r.imported, firstChange: uint32(len(c.changes))}
		for _, ch := range rs.changes[r.firstChange:r.endChange] {
			c.changes = append(c.changes, changeRecord{status: value(ch.status), at: c.keep(rs.textOf(ch.at))})
		}
		n.endChange = uint32(len(c.changes))
		c.list = append(c.list, n)
	}
	return c
}

// orderReading is a record being read, of type R (an order or a change): it keeps its
// strings in rs.
type orderReading = reading[orderRecord]

type reading[R any] struct {
	rs  *orderRecords
	rec *R
}

// kept is the string member name, kept by keep in the records and set in the field of a
// record that field points to.
func kept[R, V any](name string, field func(*R) *V, keep func(rs *orderRecords, b []byte) V) member[reading[R]] {
	return member[reading[R]]{name, func(d *jsonReader, path, name string, r *reading[R]) error {
		b, err := d.strBytes(path, name)
		*field(r.rec) = keep(r.rs, b)
		return err
	}}
}

func readImportedAt(d *jsonReader, path, name string, r *orderReading) error {
	c, err := d.value(path, name, '"', "a string")
	if c == 0 || err != nil {
		return err
	}
	b, err := d.memberString(path, name)
	r.rec.imported, r.rec.importedAt = true, r.rs.keep(b)
	return err
}

func readChanges(d *jsonReader, path, name string, r *orderReading) error {
	cpath := path + "." + name
	err := d.array(cpath, func(k int) error {
		var c changeRecord
		err := changeShape.read(d, cpath+"["+strconv.Itoa(k)+"]", &reading[changeRecord]{r.rs, &c})
		r.rs.changes = append(r.rs.changes, c)
		return err
	})
	r.rec.endChange = uint32(len(r.rs.changes))
	return err
}

// pendingOrder is a dataset's order checked and filed under its tenant, kept for build:
// its id and reference stay in the dataset's records.
type pendingOrder struct {
	rec                    int32 // its record
	createdAt, importedAt  instant
	status, platform       uint8  // its first status, and its platform: indexes into the vocabularies
	firstChange, endChange uint32 // its changes in the index's changes
	link                   int32  // its link in the index's links, or -1
}

// statusChange is an order's status from an instant on.
type statusChange struct {
	at     instant
	status uint8 // an index into orderStatuses
}

// orderLink is the shipment an order was created with, shown from createdAt on (dawn:
// the shipment always existed), and the write of a sandbox that made it (0: its records).
type orderLink struct {
	shipmentID string
	createdAt  instant
	write      uint32
}

// orderStatusAt is the status at at of an order whose first status is first and whose changes
// are changes: that of its last change at or before at.
func orderStatusAt(first uint8, changes []statusChange, at instant) uint8 {
	k := sort.Search(len(changes), func(k int) bool { return changes[k].at.after(at) })
	if k == 0 {
		return first
	}
	return changes[k-1].status
}

// addOrder checks the dataset's order r, its instants read against start, and keeps it
// for build.
func (ix *orderIndex) addOrder(path string, rs *orderRecords, r int) error {
	rec := &rs.list[r]
	id := rs.str(rec.id)
	if err := checkID(path, "id", id); err != nil {
		return err
	}
	if err := checkID(path, "merchant_reference", rs.textOf(rec.reference)); err != nil {
		return err
	}
	platform, err := oneOf(path, "platform", "platform", rs.values[rec.platform], platforms)
	if err != nil {
		return err
	}
	status, err := oneOf(path, "status", "order status", rs.values[rec.status], orderStatuses)
	if err != nil {
		return err
	}
	createdAt, err := instantField(path, "created_at", rs.str(rec.createdAt), ix.start)
	if err != nil {
		return err
	}
	if _, dup := ix.byID[id]; dup {
		return &datasetError{path: path + ".id", reason: fmt.Sprintf("duplicate order id %q in %s", id, ix.tenantName)}
	}
	p := pendingOrder{rec: int32(r), createdAt: instantOf(createdAt), importedAt: instantOf(createdAt), status: uint8(status), platform: uint8(platform), link: -1}
	if rec.imported {
		at, err := instantField(path, "imported_at", rs.str(rec.importedAt), ix.start)
		if err != nil {
			return err
		}
		if at.Before(createdAt) {
			return &datasetError{path: path + ".imported_at", reason: fmt.Sprintf("%s is before the order's created_at %s: an order is imported once it exists", formatTimestamp(at), formatTimestamp(createdAt))}
		}
		p.importedAt = instantOf(at)
	}
	p.firstChange = uint32(len(ix.changes))
	if err := ix.readChanges(path+".changes", rs, rec, &p); err != nil {
		return err
	}
	p.endChange = uint32(len(ix.changes))
	changes := ix.changes[p.firstChange:p.endChange]
	if rec.imported || isRelative(rs.str(rec.createdAt)) {
		ix.happenings = append(ix.happenings, happening{at: p.importedAt.time(), kind: orderImported, id: id, status: orderStatuses[orderStatusAt(p.status, changes, p.importedAt)]})
	}
	for _, c := range changes {
		ix.happenings = append(ix.happenings, happening{at: c.at.time(), kind: orderChanged, id: id, status: orderStatuses[c.status]})
	}
	ix.byID[id] = int32(len(ix.pending))
	ix.pending = append(ix.pending, p)
	return nil
}

// readChanges checks an order's changes and keeps them in the index: each a status of the
// vocabulary unlike the one before, at an instant after the one before (the first after
// created_at).
func (ix *orderIndex) readChanges(path string, rs *orderRecords, rec *orderRecord, p *pendingOrder) error {
	status, after, afterWhat := p.status, p.createdAt, "the order's created_at"
	for k, c := range rs.changes[rec.firstChange:rec.endChange] {
		cpath := path + "[" + strconv.Itoa(k) + "]"
		next, err := oneOf(cpath, "status", "order status", rs.values[c.status], orderStatuses)
		if err != nil {
			return err
		}
		if uint8(next) == status {
			return &datasetError{path: cpath + ".status", reason: fmt.Sprintf("%q is the status the order has already: a change changes it", orderStatuses[next])}
		}
		t, err := instantField(cpath, "at", rs.str(c.at), ix.start)
		if err != nil {
			return err
		}
		at := instantOf(t)
		if !at.after(after) {
			return &datasetError{path: cpath + ".at", reason: fmt.Sprintf("%s is not after %s %s: changes follow each other", formatInstant(at), afterWhat, formatInstant(after))}
		}
		ix.changes = append(ix.changes, statusChange{at, uint8(next)})
		status, after, afterWhat = uint8(next), at, "the change before,"
	}
	return nil
}

// has reports whether the dataset gives an order of this id.
func (ix *orderIndex) has(id string) bool {
	_, ok := ix.byID[id]
	return ok
}

// link records that the shipment shipmentID was created with the order orderID: the
// order's shipment_id, shown from createdAt on (dawn: the shipment always existed). One
// order can be linked once (a second link is the API's 409), and not by a shipment created
// before the order is imported.
func (ix *orderIndex) link(path, orderID, shipmentID string, createdAt instant, write uint32) error {
	i, ok := ix.byID[orderID]
	if !ok && write > 0 && ix.isSeed(orderID) { // a sandbox's seeded order, linked by a write (seeds come before links then)
		if ix.seedLinks == nil {
			ix.seedLinks = map[string]orderLink{}
		}
		ix.seedLinks[orderID] = orderLink{shipmentID, createdAt, write}
		return nil
	}
	if !ok {
		return &datasetError{path: path + ".order_id", reason: fmt.Sprintf("no order %q in %s to link shipment %q to", orderID, ix.tenantName, shipmentID)}
	}
	p := &ix.pending[i]
	if p.link >= 0 {
		return &datasetError{path: path + ".order_id", reason: fmt.Sprintf("order %q is already linked to shipment %q; linking it to shipment %q too is a conflict (409)", orderID, ix.links[p.link].shipmentID, shipmentID), kind: faultLink}
	}
	if createdAt != dawn && p.importedAt.after(createdAt) {
		return &datasetError{path: path + ".created_at", reason: fmt.Sprintf("shipment %q is created at %s, before its order %q is imported at %s: a shipment is created with an order the account has", shipmentID, formatInstant(createdAt), orderID, formatInstant(p.importedAt))}
	}
	p.link = int32(len(ix.links))
	ix.links = append(ix.links, orderLink{shipmentID, createdAt, write})
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

// linkOf is the shipment order i is linked to at some instant, "" for none: its JSON in the
// block is the order as it ends, link included. Only a write asks, once.
func (ix *orderIndex) linkOf(i int) string {
	var o struct {
		ShipmentID *string `json:"shipment_id"`
	}
	if json.Unmarshal(ix.resource(i), &o) != nil || o.ShipmentID == nil {
		return ""
	}
	return *o.ShipmentID
}

// isSeed reports whether id is one of the index's seeded orders.
func (ix *orderIndex) isSeed(id string) bool {
	k, ok := seedNumber(id, ix.seeds)
	return ix.seeds > 0 && ok && k < ix.seeds
}

// loadingOrder is one order on its way into the index, a dataset's or a seeded one; its
// strings are the dataset's or scratch.
type loadingOrder struct {
	id, reference         []byte
	platform              uint8
	createdAt, importedAt instant
	status                uint8 // its first status
	changes               []statusChange
	shipmentID            string  // the shipment created with it, "" for none
	linkedAt              instant // when the link shows: its shipment's creation (dawn: always)
	linkWrite             uint32  // the write of a sandbox that made the link (0: the records)
}

// seededOrder is the j-th newest of n seeded orders, in o, its strings in idBuf and refBuf.
func seededOrder(o *loadingOrder, idBuf, refBuf []byte, j, n int) {
	width := seedWidth(n)
	k := n - 1 - j
	newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	created := instantOf(newest.Add(-time.Duration(j-j/4) * 7 * time.Minute))
	*o = loadingOrder{
		id:         appendPadded(append(idBuf[:0], "ord_seed_"...), k, width),
		reference:  appendPadded(append(refBuf[:0], "SEED-"...), k, width),
		platform:   uint8(k % len(platforms)),
		createdAt:  created,
		importedAt: created,
		status:     uint8(k % len(orderStatuses)),
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

// timed reports whether what the order shows depends on the instant beyond its created_at:
// an import after it, a change of status, or a link that appears after its import; or on
// the version of the data, a link a write made (the findings judge an entry by the version
// it read).
func (o *loadingOrder) timed() bool {
	return o.importedAt != o.createdAt || len(o.changes) > 0 || o.shipmentID != "" && (o.linkedAt.after(o.importedAt) || o.linkWrite > 0)
}

// linkedBy reports whether the order's link shows at at: from its shipment's creation on.
func (o *loadingOrder) linkedBy(at instant) bool {
	return o.shipmentID != "" && !o.linkedAt.after(at)
}

// lastStatus is the order's status once every change has happened.
func (o *loadingOrder) lastStatus() uint8 {
	if len(o.changes) == 0 {
		return o.status
	}
	return o.changes[len(o.changes)-1].status
}

// newer reports whether a comes before b in a list: created_at descending, then id descending.
func newer(a, b *loadingOrder) bool {
	if c := a.createdAt.compare(b.createdAt); c != 0 {
		return c > 0
	}
	return bytes.Compare(a.id, b.id) > 0
}

// appendResource appends the order as the API shows it (exactly the spec's six fields: id,
// merchant_reference, platform, status, shipment_id, created_at) with this status and
// link. It is written by hand rather than with encoding/json because -seed-orders encodes
// a million orders at start-up: a member added, dropped or moved here changes the API's
// resource, which TestResourcesAreWrittenAsSpecified holds to the spec's six, in order, as
// encoding/json writes them.
func (o *loadingOrder) appendResource(b []byte, status uint8, linked bool) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, o.id)
	b = append(b, `,"merchant_reference":`...)
	b = appendJSONString(b, o.reference)
	b = append(b, `,"platform":`...)
	b = appendJSONString(b, platforms[o.platform])
	b = append(b, `,"status":`...)
	b = appendJSONString(b, orderStatuses[status])
	b = append(b, `,"shipment_id":`...)
	if !linked {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, o.shipmentID)
	}
	b = append(b, `,"created_at":"`...)
	b = o.createdAt.time().AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// loadingOf makes o the pending order p, its strings the dataset's.
func (ix *orderIndex) loadingOf(o *loadingOrder, p *pendingOrder) {
	rec := &ix.recs.list[p.rec]
	*o = loadingOrder{id: ix.recs.textOf(rec.id), reference: ix.recs.textOf(rec.reference), platform: p.platform,
		createdAt: p.createdAt, importedAt: p.importedAt, status: p.status, changes: ix.changes[p.firstChange:p.endChange], linkedAt: dawn}
	if p.link >= 0 {
		l := &ix.links[p.link]
		o.shipmentID, o.linkedAt, o.linkWrite = l.shipmentID, l.createdAt, l.write
	}
}

// build stores the dataset's orders and the seeded ones in list order. Seeded orders are
// made newest first and merged with the dataset's, so that a million are written straight
// into the block, with no allocation each.
func (ix *orderIndex) build() error {
	ix.byID = nil
	slices.SortFunc(ix.pending, func(a, b pendingOrder) int {
		if c := b.createdAt.compare(a.createdAt); c != 0 {
			return c
		}
		return bytes.Compare(ix.recs.textOf(ix.recs.list[b.rec].id), ix.recs.textOf(ix.recs.list[a.rec].id))
	})
	n := len(ix.pending) + ix.seeds
	ix.records = make([]storedOrder, 0, n)
	ix.block = make([]byte, 0, n*180)
	ix.ids = make([]byte, 0, n*16)
	for k, ef := range equalityFilters {
		ix.byValue[k] = make([][]int32, len(ef.vocabulary))
		ix.timedBy[k] = make([][]int32, len(ef.vocabulary))
	}
	var given, seed loadingOrder // the next of each, newest first
	var idBuf, refBuf [32]byte
	if len(ix.pending) > 0 {
		ix.loadingOf(&given, &ix.pending[0])
	}
	if ix.seeds > 0 {
		seededOrder(&seed, idBuf[:], refBuf[:], 0, ix.seeds)
	}
	for p, j := 0, 0; p < len(ix.pending) || j < ix.seeds; {
		if j == ix.seeds || p < len(ix.pending) && newer(&given, &seed) {
			if err := ix.store(&given); err != nil {
				return err
			}
			if p++; p < len(ix.pending) {
				ix.loadingOf(&given, &ix.pending[p])
			}
			continue
		}
		if l, ok := ix.seedLinks[string(seed.id)]; ok { // a nil map, as a dataset's, finds none at once
			seed.shipmentID, seed.linkedAt, seed.linkWrite = l.shipmentID, l.createdAt, l.write
		}
		if err := ix.store(&seed); err != nil {
			return err
		}
		if j++; j < ix.seeds {
			seededOrder(&seed, idBuf[:], refBuf[:], j, ix.seeds)
		}
	}
	ix.recs, ix.pending, ix.changes, ix.links, ix.seedLinks = nil, nil, nil, nil, nil
	ix.table = newIDTable(ix)
	slices.SortFunc(ix.imports, instant.compare)
	return nil
}

// store appends one order, the next in list order, and its timeline if it has one.
func (ix *orderIndex) store(o *loadingOrder) error {
	start := len(ix.block)
	last := o.lastStatus()
	ix.block = append(o.appendResource(ix.block, last, o.shipmentID != ""), ',')
	if len(ix.block) > math.MaxUint32 || len(ix.records) >= math.MaxInt32 {
		return errors.New("the orders of one account and environment exceed 4 GiB of JSON")
	}
	i := int32(len(ix.records))
	ix.records = append(ix.records, storedOrder{sec: o.createdAt.sec, nsec: o.createdAt.nsec, off: uint32(start),
		idOff: uint32(len(ix.ids)), idLen: uint8(len(o.id)), status: last, timed: o.timed()})
	ix.ids = append(ix.ids, o.id...)
	if !o.timed() {
		for k, ef := range equalityFilters {
			v := ef.value(&ix.records[i], nil)
			ix.byValue[k][v] = append(ix.byValue[k][v], i)
		}
		return nil
	}
	ix.timed = append(ix.timed, i)
	ix.imports = append(ix.imports, o.importedAt)
	tl := orderTimeline{imported: o.importedAt, first: uint32(len(ix.states)), shipmentID: o.shipmentID, linkWrite: o.linkWrite}
	// A state begins at dawn, at each change, and when the link appears. The changes are
	// walked once, in order, beside the instants: loading stays linear in them.
	begins := make([]instant, 0, len(o.changes)+2)
	begins = append(begins, dawn)
	for _, c := range o.changes {
		begins = append(begins, c.at)
	}
	if o.shipmentID != "" && o.linkedAt != dawn {
		begins = append(begins, o.linkedAt)
	}
	slices.SortFunc(begins, instant.compare)
	status, next := o.status, 0 // the status from the instant on, and the next change
	for k, from := range slices.Compact(begins) {
		for ; next < len(o.changes) && !o.changes[next].at.after(from); next++ {
			status = o.changes[next].status
		}
		linked := o.linkedBy(from)
		if k > 0 {
			if prev := ix.states[len(ix.states)-1]; prev.status == status && prev.linked == linked {
				continue
			}
		}
		off := len(ix.stateJSON)
		ix.stateJSON = o.appendResource(ix.stateJSON, status, linked)
		ix.states = append(ix.states, orderState{from: from, off: uint32(off), size: uint32(len(ix.stateJSON) - off), status: status, linked: linked})
	}
	tl.end = uint32(len(ix.states))
	ix.timelines = append(ix.timelines, tl)
	m := int32(len(ix.timelines) - 1)
	for k, ef := range equalityFilters {
		for s := tl.first; s < tl.end; s++ {
			v := ef.value(&ix.records[i], &ix.states[s])
			if l := ix.timedBy[k][v]; len(l) == 0 || l[len(l)-1] != m { // each place once: places come in order
				ix.timedBy[k][v] = append(l, m)
			}
		}
	}
	return nil
}

// ===== A sandbox's orders: filed once, built again with each write's link =====

// A sandbox's orders come from records (a template's, or those sent): its first write files
// them (each checked, its instants read against the sandbox's start, in no order yet), and
// every write builds them again from that filing with one more link, checking none again.
// A booking in a sandbox of 10,000 orders (BenchmarkCreateShipment/linking, the median of
// three runs) took 16 ms with each order checked again, 5.8 to 6.1 ms filed. Filing waits
// for the first write: most sandboxes are never written (10,000 copies of acct_sync held
// 104 MiB of heap with each copy's orders filed at its creation, under the contract's 100
// with none).

// orderSource is where a sandbox's orders come from: its records (a template's, which the
// dataset holds, or those sent, which the sandbox holds: own), and how many seeded orders
// join them.
type orderSource struct {
	recs  *orderRecords
	seeds int
	own   bool
}

// bytes is about what the source holds that the sandbox alone holds: its records, when
// they are its own.
func (src *orderSource) bytes() int64 {
	if !src.own {
		return int64(unsafe.Sizeof(*src))
	}
	return src.recs.bytes() + int64(unsafe.Sizeof(*src))
}

// filedOrders are a sandbox's orders as filed: an index of them before any link or build,
// never built itself.
type filedOrders struct {
	ix orderIndex
}

// file files the source's orders, their instants read against start, for the writes that
// build them again.
func (src *orderSource) file(start time.Time) (*filedOrders, error) {
	ix := newOrderIndex("", "", start) // named by each build: ordersWith
	ix.recs = src.recs
	for i := range src.recs.list {
		if err := ix.addOrder("$.orders["+strconv.Itoa(i)+"]", src.recs, i); err != nil {
			return nil, err
		}
	}
	if src.seeds > 0 {
		if err := ix.seedOrders(src.seeds); err != nil {
			return nil, err
		}
	}
	ix.happenings = nil // the timeline holds them already
	return &filedOrders{ix: ix}, nil
}

// bytes is about what the filed orders hold on the heap (the records are the source's).
func (f *filedOrders) bytes() int64 { return f.ix.bytes() + int64(unsafe.Sizeof(*f)) }

// ordersWith is d's orders built again, from its orders as filed (filed at its first write),
// with these links, its records' and its writes', in the order they were made; named as d's
// are (copies of one template share their source, and each names its own tenant).
func (d *tenantData) ordersWith(filed *filedOrders, links []dataLink) (orderIndex, error) {
	ix := filed.ix
	ix.tenantName, ix.tag = d.orders.tenantName, d.orders.tag
	ix.pending = slices.Clone(ix.pending)
	for _, l := range links {
		if err := ix.link("$", l.orderID, l.shipmentID, l.at, l.write); err != nil {
			return ix, err
		}
	}
	err := ix.build()
	return ix, err
}

// linkable says why the order id cannot be linked to a shipment created at at, or nil: 404
// when the account does not show it then, 409 when it is linked already, at any instant
// (the spec's second link).
func (ix *orderIndex) linkable(id string, at time.Time) error {
	_, i, err := ix.get(id, at)
	if err != nil {
		return paramError(codeNotFound, "order_id", fmt.Sprintf("No order %q is shown in this account at %s, the request's instant: a shipment is created for an order the list shows.", id, formatTimestamp(at)))
	}
	if other := ix.linkOf(i); other != "" {
		return paramError(codeOrderAlreadyLinked, "order_id", fmt.Sprintf("Order %q is linked to shipment %q already: an order is linked to one shipment, and a second link is a conflict.", id, other))
	}
	return nil
}

// ===== The index: orders in list order =====

// orderIndex holds a tenant's orders in list order (created_at descending, id descending)
// in storage the garbage collector need not walk: every order's JSON in one block, a
// fixed-size record per order, the lists per status as indexes, and the ids in an
// open-addressing table of indexes. No part of it holds a pointer per order. The few
// orders whose showing changes with the clock (a late import, a change, a link that appears)
// keep a timeline beside: the states they pass through, each with its JSON.
type orderIndex struct {
	tenantName string                          // the account and environment, as messages name them
	tag        tag                             // binds cursors to the tenant
	start      time.Time                       // while loading: the instant relative instants count from
	recs       *orderRecords                   // while loading: the dataset's orders
	pending    []pendingOrder                  // while loading: the tenant's, checked
	byID       map[string]int32                // while loading: the index of each in pending
	changes    []statusChange                  // while loading: their changes
	links      []orderLink                     // while loading: their links
	seeds      int                             // -seed-orders, generated at build
	seedLinks  map[string]orderLink            // while loading: the links a sandbox's writes made to seeded orders, by order id
	records    []storedOrder                   // in list order
	block      []byte                          // each order's JSON in list order, each followed by a comma
	ids        []byte                          // each order's id, in list order
	byValue    [len(equalityFilters)][][]int32 // for each equality filter, the orders without a timeline of each value, in list order
	table      idTable
	timed      []int32                         // indexes of the orders with a timeline, in list order
	timedBy    [len(equalityFilters)][][]int32 // for each equality filter and value, the places in timed of those whose states ever take it
	timelines  []orderTimeline                 // theirs, in the same order
	states     []orderState                    // every timeline's states, in order
	stateJSON  []byte                          // every state's JSON
	imports    []instant                       // the imports of the orders with a timeline, sorted
	happenings []happening                     // while loading: what the dataset schedules for the orders
}

// bytes is about what the index holds on the heap, every field counted here beside the
// others (TestEveryIndexFieldIsCounted adds to each and sees the count grow): what a
// sandbox's data counts toward the registry's bound. recs is the records', counted by whoever
// holds them.
func (ix *orderIndex) bytes() int64 {
	const i32 = 4
	n := len(ix.tenantName) + len(ix.block) + len(ix.ids) + len(ix.stateJSON) +
		len(ix.records)*int(unsafe.Sizeof(storedOrder{})) + len(ix.table.slots)*i32 + len(ix.timed)*i32 +
		len(ix.timelines)*int(unsafe.Sizeof(orderTimeline{})) + len(ix.states)*int(unsafe.Sizeof(orderState{})) +
		len(ix.imports)*int(unsafe.Sizeof(instant{})) + len(ix.happenings)*int(unsafe.Sizeof(happening{})) +
		len(ix.pending)*int(unsafe.Sizeof(pendingOrder{})) + len(ix.changes)*int(unsafe.Sizeof(statusChange{})) +
		len(ix.links)*int(unsafe.Sizeof(orderLink{})) + int(unsafe.Sizeof(*ix))
	for k := range ix.byValue {
		for _, l := range ix.byValue[k] {
			n += len(l) * i32
		}
		for _, l := range ix.timedBy[k] {
			n += len(l) * i32
		}
	}
	for id := range ix.byID { // a map's entry: its key's bytes, the string and value, and the map's own share
		n += len(id) + 48
	}
	for id, l := range ix.seedLinks {
		n += len(id) + len(l.shipmentID) + 64
	}
	for _, tl := range ix.timelines {
		n += len(tl.shipmentID)
	}
	for _, l := range ix.links {
		n += len(l.shipmentID)
	}
	return int64(n)
}

// storedOrder is one order's record: where its JSON and id are, its created_at, its status
// (for an order with a timeline, its last).
type storedOrder struct {
	sec    int64  // created_at: seconds since 1970 (negative before)
	off    uint32 // where its JSON starts in bytes; it ends a comma before the next's
	nsec   int32
	idOff  uint32 // where its id starts in ids
	idLen  uint8
	status uint8
	timed  bool // it has a timeline
}

// orderTimeline is when an order is imported and the states it passes through.
type orderTimeline struct {
	imported   instant
	first, end uint32 // its states are states[first:end]
	shipmentID string // the shipment it links once linked, "" for none
	linkWrite  uint32 // the write of a sandbox that made the link (0: the records)
}

// orderState is what an order shows from an instant on.
type orderState struct {
	from      instant // dawn for the first
	off, size uint32  // its JSON in stateJSON
	status    uint8
	linked    bool
}

// newOrderIndex is the orders of an account's environment, whose relative instants count
// from start.
func newOrderIndex(account, environment string, start time.Time) orderIndex {
	return orderIndex{tenantName: account + "/" + environment, tag: tagOf("tenant", account, environment), start: start, byID: map[string]int32{}}
}

// showsAs is the state the list shows an order with a timeline in at at, and whether it
// shows it at all: from its import on.
func (ix *orderIndex) showsAs(tl *orderTimeline, at instant) (*orderState, bool) {
	if tl.imported.after(at) {
		return nil, false
	}
	states := ix.states[tl.first:tl.end]
	k := sort.Search(len(states), func(k int) bool { return states[k].from.after(at) })
	return &states[k-1], true
}

// stateJSONOf is a state's JSON.
func (ix *orderIndex) stateJSONOf(st *orderState) []byte {
	return ix.stateJSON[st.off : st.off+st.size]
}

// The record accessors: order i is the i-th of the list of all, newest first.

func (ix *orderIndex) count() int { return len(ix.records) }

func (ix *orderIndex) resource(i int) []byte {
	return ix.block[ix.records[i].off:ix.jsonEnd(i)]
}

// end is where order i's JSON ends in bytes: a comma before the next order's.
func (ix *orderIndex) jsonEnd(i int) int {
	if i+1 < len(ix.records) {
		return int(ix.records[i+1].off) - 1
	}
	return len(ix.block) - 1
}

func (ix *orderIndex) idOf(i int) []byte {
	r := &ix.records[i]
	return ix.ids[r.idOff : r.idOff+uint32(r.idLen)]
}

func (ix *orderIndex) createdAt(i int) time.Time {
	return time.Unix(ix.records[i].sec, int64(ix.records[i].nsec)).UTC()
}

// after reports whether order i was created after at.
func (ix *orderIndex) after(i int, at time.Time) bool {
	return ix.records[i].created().after(instantOf(at))
}

// created is the order's created_at.
func (r *storedOrder) created() instant { return instant{r.sec, r.nsec} }

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
		h := int(maphash.Bytes(t.seed, ix.idOf(i)) & uint64(size-1))
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
		if i := int(t.slots[h] - 1); string(ix.idOf(i)) == id {
			return i
		}
	}
	return -1
}

// ===== The query of GET /v1/orders =====

// The query of GET /v1/orders: one table of its parameters, which its parser, its messages,
// the cursor's binding of the filters and the README's list (a test checks it) all read.

// orderFilter is what a list keeps of the orders: for each equality filter the value it
// keeps (anyValue for every order), and an inclusive range of created_at (dawn and never
// where it is open). The cursor binds it: a page is of one filter.
type orderFilter struct {
	equal    [len(equalityFilters)]int8
	from, to instant
}

// anyValue is an equality filter that keeps every order.
const anyValue = -1

// everyOrder is the filter of a query that gives none.
func everyOrder() orderFilter {
	f := orderFilter{from: dawn, to: never}
	for k := range f.equal {
		f.equal[k] = anyValue
	}
	return f
}

// equalityFilter is a parameter that keeps the orders whose field has one value of its
// vocabulary. Each has an index, built from this table: the orders without a timeline of
// each value, in list order.
type equalityFilter struct {
	param      string
	vocabulary []string
	value      func(r *storedOrder, st *orderState) uint8 // the order's, as it shows in st (nil: it has no timeline)
}

var equalityFilters = [...]equalityFilter{
	{"status", orderStatuses, func(r *storedOrder, st *orderState) uint8 {
		if st != nil {
			return st.status
		}
		return r.status
	}},
}

// keeps reports whether f keeps order i, which shows as st (nil: it has no timeline), by
// its equality filters.
func (f *orderFilter) keeps(r *storedOrder, st *orderState) bool {
	for k, v := range f.equal {
		if v != anyValue && equalityFilters[k].value(r, st) != uint8(v) {
			return false
		}
	}
	return true
}

// narrowest is the first equality filter f sets, whose index a page walks, or -1.
func (f *orderFilter) narrowest() int {
	for k, v := range f.equal {
		if v != anyValue {
			return k
		}
	}
	return -1
}

// equalities is how many equality filters f sets.
func (f *orderFilter) equalities() int {
	n := 0
	for _, v := range f.equal {
		if v != anyValue {
			n++
		}
	}
	return n
}

// tag binds a cursor to the filter: the same instants, however written, are the same filter.
func (f *orderFilter) tag() tag {
	var buf [len(equalityFilters) + 2*13]byte
	b := buf[:0]
	for _, v := range f.equal {
		b = append(b, byte(v+1))
	}
	for _, bound := range [...]instant{f.from, f.to} {
		if bound == dawn || bound == never {
			b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
			continue
		}
		b = append(b, 1)
		b = binary.BigEndian.AppendUint64(b, uint64(bound.sec))
		b = binary.BigEndian.AppendUint32(b, uint32(bound.nsec))
	}
	return tagOf("orders", string(b))
}

// orderQuery is a parsed GET /v1/orders query.
type orderQuery struct {
	limit  int
	cursor *string // verified against the filter once it is read whole
	filter orderFilter
}

// listParam is a parameter of GET /v1/orders and how its value is read into a query. A
// filter's value is bound to the cursor: it must stay the same between pages.
type listParam struct {
	name   string
	filter bool
	read   func(q orderQuery, value string) (orderQuery, error) // by value: a pointer to the query would move it to the heap at every page
}

// listParams are the parameters of GET /v1/orders, in the order its messages name them.
var listParams = listParamsOf()

func listParamsOf() []listParam {
	params := []listParam{{"limit", false, readLimit}, {"cursor", false, func(q orderQuery, v string) (orderQuery, error) { q.cursor = &v; return q, nil }}}
	for k := range equalityFilters {
		params = append(params, listParam{equalityFilters[k].param, true, readEqual(k)})
	}
	return append(params,
		listParam{"created_from", true, readBound("created_from", func(f *orderFilter) *instant { return &f.from })},
		listParam{"created_to", true, readBound("created_to", func(f *orderFilter) *instant { return &f.to })})
}

// listParamNames names the parameters (the filters only, when filters), as a sentence
// does: "status, created_from and created_to".
func listParamNames(filters bool) string {
	var names []string
	for _, p := range listParams {
		if p.filter || !filters {
			names = append(names, p.name)
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func readLimit(q orderQuery, value string) (orderQuery, error) {
	n, ok := parseWhole(value, maxPageSize)
	if !ok || n < 1 {
		return q, paramError(codeInvalidParameter, "limit", fmt.Sprintf("limit must be a whole number from 1 to %d.", maxPageSize))
	}
	q.limit = n
	return q, nil
}

// readEqual reads the value of equality filter k.
func readEqual(k int) func(q orderQuery, value string) (orderQuery, error) {
	ef := &equalityFilters[k]
	return func(q orderQuery, value string) (orderQuery, error) {
		v := slices.Index(ef.vocabulary, value)
		if v < 0 {
			return q, paramError(codeInvalidParameter, ef.param, ef.param+" must be one of "+strings.Join(ef.vocabulary, ", ")+".")
		}
		q.filter.equal[k] = int8(v)
		return q, nil
	}
}

// readBound reads the instant of created_from or created_to (name) into the bound of the
// filter that bound picks.
func readBound(name string, bound func(f *orderFilter) *instant) func(q orderQuery, value string) (orderQuery, error) {
	return func(q orderQuery, value string) (orderQuery, error) {
		t, err := parseTimestamp(value)
		if _, plus := parseTimestamp(strings.Replace(value, " ", "+", 1)); err != nil && plus == nil {
			return q, paramError(codeInvalidParameter, name, "The value of "+name+" has a space where its offset's + should be: a query reads a literal + as a space. Send the + as %2B (such as 2026-11-01T00:00:00%2B01:00), or give the instant in Z.")
		}
		if err != nil {
			return q, paramError(codeInvalidParameter, name, "The value of "+name+" "+err.Error()+".")
		}
		*bound(&q.filter) = instantOf(t)
		return q, nil
	}
}

// parseOrderQuery reads the GET /v1/orders query. Faults are reported in the order the
// parameters were sent, each pair judged by its name, then by its value; the cursor itself
// is verified later, against the filter.
func parseOrderQuery(raw string) (orderQuery, error) {
	q := orderQuery{limit: defaultPageSize, filter: everyOrder()}
	var seen uint64 // a bit for each of listParams
	for p, rest, ok := nextParam(raw); ok; p, rest, ok = nextParam(rest) {
		i := slices.IndexFunc(listParams, func(lp listParam) bool { return lp.name == p.name })
		if i < 0 {
			return q, unknownParam(p.name, "GET /v1/orders takes "+listParamNames(false)+".")
		}
		if seen&(1<<i) != 0 {
			return q, paramError(codeInvalidParameter, p.name, p.name+" is given more than once; give it once.")
		}
		seen |= 1 << i
		value, err := p.value()
		if err != nil {
			return q, err
		}
		if q, err = listParams[i].read(q, value); err != nil {
			return q, err
		}
	}
	if q.filter.from.after(q.filter.to) {
		return q, paramError(codeInvalidParameter, "created_from", "created_from must not be after created_to.")
	}
	return q, nil
}

// errCursorFilters answers a cursor of another filter.
var errCursorFilters = paramError(codeInvalidCursor, "cursor", "The cursor was issued for other filters. Keep "+listParamNames(true)+" the same between pages.")

// ===== Pages: what a list shows at an instant =====

// Pages: what a list shows at an instant, without a scan.

// span is where the list f asks for lies as the clock shows it at at, in positions of the
// list of all orders, after the position after: from the newest created at or before both
// at and created_to (an order is listed from its import, which is never before its
// created_at), to the last created at or after created_from.
func (ix *orderIndex) span(f *orderFilter, after *cursorPosition, at instant) (lo, hi int) {
	n := len(ix.records)
	to := at
	if at.after(f.to) {
		to = f.to
	}
	lo = sort.Search(n, func(i int) bool { return !ix.records[i].created().after(to) })
	if after != nil {
		pos := instantOf(after.createdAt)
		lo = max(lo, sort.Search(n, func(i int) bool {
			c := ix.records[i].created().compare(pos)
			return c < 0 || (c == 0 && string(ix.idOf(i)) < after.id)
		}))
	}
	hi = sort.Search(n, func(i int) bool { return f.from.after(ix.records[i].created()) })
	return lo, max(lo, hi)
}

// listed calls yield with what the list f keeps shows at at between positions lo and hi,
// in list order, until yield returns false: orders without a timeline as runs of
// positions i to j (body nil; one order a run when f has an equality filter), and each
// order with a timeline that shows at at, one at a time, with the body it shows. It visits
// no order outside [lo, hi) and, beyond what it yields, only orders with a timeline and,
// where f has several equality filters, those its narrowest keeps.
func (ix *orderIndex) listed(f *orderFilter, lo, hi int, at instant, yield func(i, j int, body []byte) bool) {
	m, mEnd := searchIndexes(ix.timed, lo), searchIndexes(ix.timed, hi)
	k := f.narrowest()
	var still []int32 // the orders without a timeline that the narrowest equality filter keeps
	if k >= 0 {
		list := ix.byValue[k][f.equal[k]]
		still = list[searchIndexes(list, lo):searchIndexes(list, hi)]
	}
	for pos := lo; ; m++ {
		next := hi // the next order with a timeline
		if m < mEnd {
			next = int(ix.timed[m])
		}
		if k < 0 {
			if pos < next && !yield(pos, next, nil) {
				return
			}
		} else {
			for ; len(still) > 0 && int(still[0]) < next; still = still[1:] {
				if i := int(still[0]); f.keeps(&ix.records[i], nil) && !yield(i, i+1, nil) {
					return
				}
			}
		}
		if m == mEnd {
			return
		}
		if st, ok := ix.showsAs(&ix.timelines[m], at); ok && f.keeps(&ix.records[next], st) && !yield(next, next+1, ix.stateJSONOf(st)) {
			return
		}
		pos = next + 1
	}
}

// searchIndexes is the first place in list, ascending record indexes, holding i or more.
func searchIndexes(list []int32, i int) int {
	return sort.Search(len(list), func(k int) bool { return int(list[k]) >= i })
}

// appendPage appends the orders of one page, comma-separated, to b: the first limit orders
// the list f keeps shows at at between lo and hi. It returns the record index of the
// page's last order, and whether more follow.
func (ix *orderIndex) appendPage(b []byte, f *orderFilter, limit, lo, hi int, at instant) ([]byte, int, bool) {
	if searchIndexes(ix.timed, lo) == searchIndexes(ix.timed, hi) && f.equalities() <= 1 {
		return ix.appendStill(b, f, limit, lo, hi)
	}
	n, last, more := 0, -1, false
	ix.listed(f, lo, hi, at, func(i, j int, body []byte) bool {
		if n == limit {
			more = true
			return false
		}
		if n > 0 {
			b = append(b, ',')
		}
		if body != nil {
			b = append(b, body...)
			n, last = n+1, i
			return true
		}
		take := min(j-i, limit-n)
		b = append(b, ix.block[ix.records[i].off:ix.jsonEnd(i+take-1)]...) // a run is one slice of the block
		n, last = n+take, i+take-1
		if take < j-i {
			more = true
			return false
		}
		return true
	})
	return b, last, more
}

// appendStill is appendPage where no order of the span has a timeline and f sets at most
// its one equality filter: the list of all is one slice of the block, a value's list one
// copy an order.
func (ix *orderIndex) appendStill(b []byte, f *orderFilter, limit, lo, hi int) ([]byte, int, bool) {
	k := f.narrowest()
	if k < 0 {
		take := min(limit, hi-lo)
		if take == 0 {
			return b, -1, false
		}
		return append(b, ix.block[ix.records[lo].off:ix.jsonEnd(lo+take-1)]...), lo + take - 1, hi-lo > take
	}
	list := ix.byValue[k][f.equal[k]]
	from, end := searchIndexes(list, lo), searchIndexes(list, hi)
	take := min(limit, end-from)
	if take == 0 {
		return b, -1, false
	}
	for n, i := range list[from : from+take] {
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, ix.resource(int(i))...)
	}
	return b, int(list[from+take-1]), end-from > take
}

// visible is the position of the newest order that may show at at: none before it was
// created yet.
func (ix *orderIndex) visible(at instant) int {
	return sort.Search(len(ix.records), func(i int) bool { return !ix.records[i].created().after(at) })
}

// listedCount is how many orders the list of all shows at at, without a scan: those
// without a timeline created by then, and those with one imported by then.
func (ix *orderIndex) listedCount(at instant) int {
	lo := ix.visible(at)
	still := len(ix.records) - lo - (len(ix.timed) - searchIndexes(ix.timed, lo))
	return still + sort.Search(len(ix.imports), func(k int) bool { return ix.imports[k].after(at) })
}

// listedOrder is an order as a list shows it at an instant.
type listedOrder struct {
	id, status string
	createdAt  time.Time
}

// firstListed is the first n orders GET /v1/orders lists at at, and how many more it does.
func (ix *orderIndex) firstListed(at time.Time, n int) ([]listedOrder, int) {
	var orders []listedOrder
	now, all := instantOf(at), everyOrder()
	ix.listed(&all, ix.visible(now), len(ix.records), now, func(i, j int, body []byte) bool {
		for ; i < j && len(orders) < n; i++ {
			status := ix.records[i].status
			if body != nil {
				st, _ := ix.showsAs(ix.timelineOf(i), now)
				status = st.status
			}
			orders = append(orders, listedOrder{string(ix.idOf(i)), orderStatuses[status], ix.createdAt(i)})
		}
		return len(orders) < n
	})
	return orders, ix.listedCount(now) - len(orders)
}

// timelineOf is the timeline of order i, which has one.
func (ix *orderIndex) timelineOf(i int) *orderTimeline {
	return &ix.timelines[searchIndexes(ix.timed, i)]
}

// ===== The two operations: GET /v1/orders/{id} and GET /v1/orders =====

var errOrderNotFound = &apiError{code: codeNotFound, detail: "No imported order with this ID exists in this account and environment."}

// get is the order with this id as GET /v1/orders/{id} shows it at at, and its position:
// an order is found from its import on, as it stands then.
func (ix *orderIndex) get(id string, at time.Time) ([]byte, int, error) {
	i := ix.table.find(ix, id)
	if i < 0 || ix.after(i, at) {
		return nil, -1, errOrderNotFound
	}
	if !ix.records[i].timed {
		return ix.resource(i), i, nil
	}
	st, ok := ix.showsAs(ix.timelineOf(i), instantOf(at))
	if !ok {
		return nil, -1, errOrderNotFound
	}
	return ix.stateJSONOf(st), i, nil
}

// page appends to b the answer of GET /v1/orders with this raw query, as the list shows it
// at at: a page of the tenant's orders, newest first, assembled from their prepared bytes,
// and its pagination, with a next_cursor cursors signs. It says what the page showed.
func (ix *orderIndex) page(b []byte, rawQuery string, cursors *cursorSigner, at time.Time) ([]byte, listedPage, error) {
	q, err := parseOrderQuery(rawQuery)
	if err != nil {
		return b, listedPage{}, err
	}
	filter := q.filter.tag()
	var after *cursorPosition
	if q.cursor != nil {
		pos, bound, err := cursors.verify(*q.cursor, ix.tag)
		if err != nil {
			return b, listedPage{}, err
		}
		if bound != filter {
			return b, listedPage{}, errCursorFilters
		}
		after = &pos
	}
	now := instantOf(at)
	lo, hi := ix.span(&q.filter, after, now)
	b = append(b, `{"data":[`...)
	b, last, more := ix.appendPage(b, &q.filter, q.limit, lo, hi, now)
	listed := listedPage{filter: q.filter, first: int32(lo), last: int32(last), more: more}
	b = append(b, `],"pagination":{"limit":`...)
	b = strconv.AppendInt(b, int64(q.limit), 10)
	if !more {
		return append(b, `,"next_cursor":null,"has_more":false}}`...), listed, nil
	}
	b = append(b, `,"next_cursor":"`...)
	b = cursors.appendSigned(b, ix.tag, filter, ix.createdAt(last), ix.idOf(last))
	return append(b, `","has_more":true}}`...), listed, nil
}

// ===== What a page showed, as the findings judge it =====

// What a page showed, and the orders with a timeline as the journal's findings judge them.

// listedPage is what a page showed, as positions: the orders its filter keeps at its
// instant from position first to last (-1: none), then whether more followed. With the
// dataset and the instant, which never change, it gives the page's orders exactly.
type listedPage struct {
	filter      orderFilter
	first, last int32
	more        bool
}

// pageOrders calls yield with the position of each order page p showed at at, in order.
func (ix *orderIndex) pageOrders(p *listedPage, at instant, yield func(i int)) {
	if p.last < 0 {
		return
	}
	ix.listed(&p.filter, int(p.first), int(p.last)+1, at, func(i, j int, _ []byte) bool {
		for ; i < j; i++ {
			yield(i)
		}
		return true
	})
}

// pageTimed calls yield with each order with a timeline (its place m among them) that
// page p showed at at.
func (ix *orderIndex) pageTimed(p *listedPage, at instant, yield func(m int)) {
	if p.last < 0 {
		return
	}
	visit := func(m int) {
		if st, ok := ix.showsAs(&ix.timelines[m], at); ok && p.filter.keeps(&ix.records[ix.timed[m]], st) {
			yield(m)
		}
	}
	lo, hi := searchIndexes(ix.timed, int(p.first)), searchIndexes(ix.timed, int(p.last)+1)
	if k := p.filter.narrowest(); k >= 0 { // only those that ever take the value: a page of a rare status spans many others
		list := ix.timedBy[k][p.filter.equal[k]]
		for _, m := range list[searchIndexes(list, lo):searchIndexes(list, hi)] {
			visit(int(m))
		}
		return
	}
	for m := lo; m < hi; m++ {
		visit(m)
	}
}

func (ix *orderIndex) timedCount() int { return len(ix.timed) }

// timedOf is the place among the orders with a timeline of the order at position i, if
// it has one.
func (ix *orderIndex) timedOf(i int) (int, bool) {
	m := searchIndexes(ix.timed, i)
	return m, m < len(ix.timed) && int(ix.timed[m]) == i
}

func (ix *orderIndex) timedID(m int) string { return string(ix.idOf(int(ix.timed[m]))) }

// timedInstants is the created_at and the import of the m-th order with a timeline.
func (ix *orderIndex) timedInstants(m int) (created, imported instant) {
	return ix.records[ix.timed[m]].created(), ix.timelines[m].imported
}

// timedState is the m-th order with a timeline as it stands at at in the version of the
// data that held writes writes (a link a later write made does not show), and whether it
// is imported by then.
func (ix *orderIndex) timedState(m int, at instant, writes uint32) (orderState, bool) {
	tl := &ix.timelines[m]
	st, ok := ix.showsAs(tl, at)
	if !ok {
		return orderState{}, false
	}
	state := *st
	if tl.linkWrite > writes {
		state.linked = false
	}
	return state, true
}

// stateText writes a state of the m-th order with a timeline: its status and shipment_id.
func (ix *orderIndex) stateText(m int, st orderState) string {
	link := "null"
	if st.linked {
		link = ix.timelines[m].shipmentID
	}
	return orderStatuses[st.status] + " with shipment_id " + link
}

// ===== Which pages held an order's place =====

// Which pages held an order's place: the pages a journal's entries read, walked beside the
// orders with a timeline in list order. A page held the places whose created_at its
// filter's range holds, up to where it reached (to its last order when more followed, else
// the end of its range): one run of positions each. Walked by position, the pages open
// over their run are kept by their filter's equality values and by instant, so that
// whether a page of some instants held a place is a search, not a walk of every page.

// readPage is a page an entry read: its instant, what it showed, and the entry's place among
// the entries judged, which are in seq order.
type readPage struct {
	at    instant
	page  *listedPage
	entry int32
}

// heldPages are the pages of a journal, by instant (then seq: a page's rank), opened and
// shut as the walk reaches the places each held.
type heldPages struct {
	ix       *orderIndex
	instants []instant // each rank's
	groups   []pageGroup
	opening  []heldRun // by where their places begin
	closing  []heldRun // by where they end
}

// heldRun is the run of places a page held: [lo, hi), and where it is kept.
type heldRun struct {
	lo, hi, rank, group int
	entry               int32
}

// pageGroup is the pages of one set of equality values: the entry of each one open at the
// walk's place, plus one (0 when shut), by rank.
type pageGroup struct {
	filter orderFilter
	open   maxTree
}

func (ix *orderIndex) newHeldPages(pages []readPage) *heldPages {
	slices.SortStableFunc(pages, func(a, b readPage) int { return a.at.compare(b.at) })
	h := &heldPages{ix: ix, instants: make([]instant, len(pages))}
	groupOf := map[[len(equalityFilters)]int8]int{}
	for rank, p := range pages {
		h.instants[rank] = p.at
		g, ok := groupOf[p.page.filter.equal]
		if !ok {
			g = len(h.groups)
			groupOf[p.page.filter.equal] = g
			h.groups = append(h.groups, pageGroup{filter: p.page.filter})
		}
		lo, hi := ix.placesHeld(p.page)
		h.opening = append(h.opening, heldRun{lo, hi, rank, g, p.entry})
	}
	for g := range h.groups {
		h.groups[g].open = newMaxTree(len(pages))
	}
	h.closing = slices.Clone(h.opening)
	slices.SortFunc(h.opening, func(a, b heldRun) int { return a.lo - b.lo })
	slices.SortFunc(h.closing, func(a, b heldRun) int { return a.hi - b.hi })
	return h
}

// placesHeld is the run of positions page p held: those whose created_at its filter's
// range holds, up to its last order when more followed.
func (ix *orderIndex) placesHeld(p *listedPage) (lo, hi int) {
	n := len(ix.records)
	lo = sort.Search(n, func(i int) bool { return !ix.records[i].created().after(p.filter.to) })
	hi = sort.Search(n, func(i int) bool { return p.filter.from.after(ix.records[i].created()) })
	if p.more {
		hi = min(hi, int(p.last))
	}
	return lo, max(lo, hi)
}

// reach moves the walk on to position i: the pages that held it are open, no other.
func (h *heldPages) reach(i int) {
	for len(h.opening) > 0 && h.opening[0].lo <= i {
		r := h.opening[0]
		h.groups[r.group].open.put(r.rank, r.entry+1)
		h.opening = h.opening[1:]
	}
	for len(h.closing) > 0 && h.closing[0].hi <= i {
		r := h.closing[0]
		h.groups[r.group].open.put(r.rank, 0)
		h.closing = h.closing[1:]
	}
}

// ranksAfter is the first rank of a page judged after at; ranksFrom, at or after it.
func (h *heldPages) ranksAfter(at instant) int {
	return sort.Search(len(h.instants), func(k int) bool { return h.instants[k].after(at) })
}

func (h *heldPages) ranksFrom(at instant) int {
	return sort.Search(len(h.instants), func(k int) bool { return !at.after(h.instants[k]) })
}

// leftBetween reports whether a page judged after from and by until held the place of the
// m-th order with a timeline (the walk is at it) and had an equality filter that excluded
// it as it stood at the page's instant: the state it stood in then is searched, each state
// of the order in that span asked of each set of values that excludes it.
func (h *heldPages) leftBetween(m int, from, until instant) bool {
	ix := h.ix
	r, tl := &ix.records[ix.timed[m]], &ix.timelines[m]
	states := ix.states[tl.first:tl.end]
	lo, hi := h.ranksAfter(from), h.ranksAfter(until)
	first := sort.Search(len(states), func(k int) bool { return states[k].from.after(from) }) - 1
	end := sort.Search(len(states), func(k int) bool { return states[k].from.after(until) })
	for _, g := range h.groups {
		if g.filter.equalities() == 0 {
			continue
		}
		for k := max(first, 0); k < end; k++ {
			if g.filter.keeps(r, &states[k]) {
				continue
			}
			kLo, kHi := max(lo, h.ranksFrom(states[k].from)), hi
			if k+1 < len(states) {
				kHi = min(kHi, h.ranksFrom(states[k+1].from))
			}
			if kLo < kHi && g.open.highest(kLo, kHi) > 0 {
				return true
			}
		}
	}
	return false
}

// heldBefore is the entry of the page, of the highest seq, judged before the instant
// before, that held the place of the m-th order with a timeline (the walk is at it) with a
// filter that keeps it as it stands at its import; -1 for none.
func (h *heldPages) heldBefore(m int, before instant) int {
	ix := h.ix
	r, tl := &ix.records[ix.timed[m]], &ix.timelines[m]
	st, _ := ix.showsAs(tl, tl.imported)
	hi, best := h.ranksFrom(before), int32(0)
	for _, g := range h.groups {
		if g.filter.keeps(r, st) {
			best = max(best, g.open.highest(0, hi))
		}
	}
	return int(best) - 1
}

// maxTree is a segment tree over n values, each from 0: setting one and the maximum of a
// range of them each take a logarithm of n.
type maxTree struct {
	n int
	v []int32 // v[n+i] is value i; v[k] the maximum of v[2k] and v[2k+1]
}

func newMaxTree(n int) maxTree { return maxTree{n, make([]int32, 2*n)} }

func (t *maxTree) put(i int, x int32) {
	i += t.n
	t.v[i] = x
	for i > 1 {
		i >>= 1
		t.v[i] = max(t.v[2*i], t.v[2*i+1])
	}
}

// firstAtLeast is the first i from lo on whose value is at least x, or n: a search of
// the maxima of the runs from lo.
func (t *maxTree) firstAtLeast(lo int, x int32) int {
	return lo + sort.Search(t.n-lo, func(k int) bool { return t.highest(lo, lo+k+1) >= x })
}

// highest is the largest of the values lo to hi-1, 0 when none.
func (t *maxTree) highest(lo, hi int) int32 {
	var m int32
	for lo, hi = lo+t.n, hi+t.n; lo < hi; lo, hi = lo>>1, hi>>1 {
		if lo&1 == 1 {
			m = max(m, t.v[lo])
			lo++
		}
		if hi&1 == 1 {
			hi--
			m = max(m, t.v[hi])
		}
	}
	return m
}
