package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Tracking statuses: shipment status and events[].status.
var trackingStatuses = []string{
	"pre_transit", "in_transit", "out_for_delivery", "available_for_pickup", "delivered",
	"return_to_sender", "failure", "cancelled", "unknown",
}

// parseTimestamp reads a strict RFC 3339 date-time with an explicit offset ("Z", "z" or
// ±hh:mm; "T" or "t"; optional fractional seconds) and returns the same instant in UTC.
// It refuses what time.Parse lets through but RFC 3339 does not (a one-digit hour, hour 24,
// second 60, an offset of 24 hours or more), anything without an offset, and instants
// whose UTC year falls outside 0000..9999 (they could not be written back as RFC 3339).
func parseTimestamp(s string) (time.Time, bool) {
	// 2006-01-02T15:04:05 is 19 bytes; at least one byte of offset follows.
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := parseDigits(s[0:4], 4)
	month, ok2 := parseDigits(s[5:7], 2)
	day, ok3 := parseDigits(s[8:10], 2)
	hour, ok4 := parseDigits(s[11:13], 2)
	minute, ok5 := parseDigits(s[14:16], 2)
	sec, ok6 := parseDigits(s[17:19], 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 ||
		day > daysIn(time.Month(month), year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	rest := s[19:]
	nsec := 0
	if rest[0] == '.' {
		i := 1
		for ; i < len(rest) && rest[i] >= '0' && rest[i] <= '9'; i++ {
			if i <= 9 { // digits past nanoseconds are truncated
				nsec = nsec*10 + int(rest[i]-'0')
			}
		}
		if i == 1 {
			return time.Time{}, false
		}
		for d := i; d <= 9; d++ {
			nsec *= 10
		}
		rest = rest[i:]
	}
	var offset int
	switch {
	case rest == "Z" || rest == "z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, okh := parseDigits(rest[1:3], 2)
		om, okm := parseDigits(rest[4:6], 2)
		if !okh || !okm || oh > 23 || om > 59 {
			return time.Time{}, false
		}
		offset = (oh*60 + om) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC).Add(-time.Duration(offset) * time.Second)
	if t.Year() < 0 || t.Year() > 9999 {
		return time.Time{}, false
	}
	return t, true
}

func daysIn(m time.Month, year int) int {
	return time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// formatTimestamp writes an instant as responses do: UTC, suffix Z, fractional seconds
// only when non-zero.
func formatTimestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// rawEvent is a carrier event as the dataset holds it, before normalization. The timestamp
// is kept raw: a value that is not an RFC 3339 string drops the event, it does not refuse
// the dataset.
type rawEvent struct {
	Timestamp   json.RawMessage `json:"timestamp"`
	Status      string          `json:"status"`
	Description *string         `json:"description"`
	Location    *string         `json:"location"`
}

// trackingEvent is a stored, normalized event as the API shows it.
type trackingEvent struct {
	Status      string `json:"status"`
	Description string `json:"description"`
	Timestamp   string `json:"timestamp"`
	Location    string `json:"location"`
}

// trackingView is the body both tracking operations answer with.
type trackingView struct {
	ShipmentID     string          `json:"shipment_id"`
	Reference      string          `json:"reference"`
	TrackingNumber *string         `json:"tracking_number"`
	Status         string          `json:"status"`
	Events         []trackingEvent `json:"events"`
}

// normalization counts what normalizing a shipment's raw events left out.
type normalization struct {
	dropped    int // timestamp not interpretable
	duplicates int // same instant and description as an earlier event
}

// normalizeEvents turns raw carrier events into stored events: events whose timestamp is
// not strict RFC 3339 with an offset are dropped; instants are kept and written in UTC;
// an event with the instant and description of an earlier one is a duplicate (the first is
// kept); events are ordered oldest first, stable for equal instants; a missing location is "".
func normalizeEvents(raw []rawEvent) ([]trackingEvent, normalization) {
	type stamped struct {
		at time.Time
		ev trackingEvent
	}
	type identity struct {
		sec, nsec   int64
		description string
	}
	var n normalization
	kept := make([]stamped, 0, len(raw))
	seen := make(map[identity]bool, len(raw))
	for _, e := range raw {
		var s string
		at, ok := time.Time{}, json.Unmarshal(e.Timestamp, &s) == nil
		if ok {
			at, ok = parseTimestamp(s)
		}
		if !ok {
			n.dropped++
			continue
		}
		id := identity{at.Unix(), int64(at.Nanosecond()), *e.Description}
		if seen[id] {
			n.duplicates++
			continue
		}
		seen[id] = true
		ev := trackingEvent{Status: e.Status, Description: *e.Description, Timestamp: formatTimestamp(at)}
		if e.Location != nil {
			ev.Location = *e.Location
		}
		kept = append(kept, stamped{at, ev})
	}
	slices.SortStableFunc(kept, func(a, b stamped) int { return a.at.Compare(b.at) })
	events := make([]trackingEvent, len(kept))
	for i, k := range kept {
		events[i] = k.ev
	}
	return events, n
}

// shipmentRecord is a shipment as the dataset holds it.
type shipmentRecord struct {
	ID             string  `json:"id"`
	Account        string  `json:"account"`
	Environment    string  `json:"environment"`
	Reference      string  `json:"reference"`
	TrackingNumber *string `json:"tracking_number"`
	// ParcelTrackingNumbers are the numbers of further parcels of the consignment; lookup
	// by tracking number matches the primary number only.
	ParcelTrackingNumbers []string          `json:"parcel_tracking_numbers"`
	OrderID               *string           `json:"order_id"`
	Events                []json.RawMessage `json:"events"`
}

// shipment is a stored shipment: its tracking view is encoded once, at load.
type shipment struct {
	id      string
	orderID string // the imported order it was created with, "" when none
	view    preparedJSON
}

// loadShipment checks one dataset shipment, normalizes its events and prepares its view.
func loadShipment(path string, rec shipmentRecord) (*shipment, normalization, error) {
	if err := required(path, "id", rec.ID); err != nil {
		return nil, normalization{}, err
	}
	if err := required(path, "reference", rec.Reference); err != nil {
		return nil, normalization{}, err
	}
	if rec.TrackingNumber != nil && *rec.TrackingNumber == "" {
		return nil, normalization{}, &datasetError{path: path + ".tracking_number", reason: "must not be empty; use null for a shipment without a tracking number"}
	}
	for i, p := range rec.ParcelTrackingNumbers {
		if p == "" {
			return nil, normalization{}, &datasetError{path: fmt.Sprintf("%s.parcel_tracking_numbers[%d]", path, i), reason: "must not be empty"}
		}
	}
	raw := make([]rawEvent, len(rec.Events))
	for i, msg := range rec.Events {
		epath := fmt.Sprintf("%s.events[%d]", path, i)
		if err := decodeStrict(msg, epath, &raw[i]); err != nil {
			return nil, normalization{}, err
		}
		if err := oneOf(epath+".status", "tracking status", raw[i].Status, trackingStatuses); err != nil {
			return nil, normalization{}, err
		}
		if raw[i].Description == nil {
			return nil, normalization{}, &datasetError{path: epath + ".description", reason: "required"}
		}
	}
	events, n := normalizeEvents(raw)
	view := trackingView{
		ShipmentID:     rec.ID,
		Reference:      rec.Reference,
		TrackingNumber: rec.TrackingNumber,
		Status:         "pre_transit",
		Events:         events,
	}
	if len(events) > 0 {
		view.Status = events[len(events)-1].Status
	}
	s := &shipment{id: rec.ID, view: prepareJSON(view)}
	if rec.OrderID != nil {
		s.orderID = *rec.OrderID
	}
	return s, n, nil
}

// addShipment files a shipment under its tenant. A tracking number held by more than one
// shipment of the tenant is ambiguous: it maps to nil, and lookup answers 404.
func (t *tenant) addShipment(s *shipment, trackingNumber *string) {
	t.shipments[s.id] = s
	if trackingNumber == nil {
		return
	}
	if _, taken := t.byTrackingNumber[*trackingNumber]; taken {
		t.byTrackingNumber[*trackingNumber] = nil
		return
	}
	t.byTrackingNumber[*trackingNumber] = s
}

var (
	errShipmentNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this ID exists in this account and environment."}
	errTrackingNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this primary tracking number exists in this account and environment."}
	errTrackingAmbiguous = &apiError{code: codeNotFound, detail: "This tracking number belongs to more than one shipment in this account and environment; look the shipment up by its ID."}
)

// handleTrackingByID answers GET /v1/shipments/{id}/tracking.
func handleTrackingByID() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := tenantOf(w).shipments[r.PathValue("id")]
		if s == nil {
			writeError(w, errShipmentNotFound)
			return
		}
		s.view.write(w)
	})
}

// handleTrackingByNumber answers GET /v1/tracking/{tracking_number}: an exact match on the
// primary tracking number within the key's account and environment.
func handleTrackingByNumber() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, known := tenantOf(w).byTrackingNumber[r.PathValue("tracking_number")]
		switch {
		case s != nil:
			s.view.write(w)
		case known:
			writeError(w, errTrackingAmbiguous)
		default:
			writeError(w, errTrackingNotFound)
		}
	})
}
