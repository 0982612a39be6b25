// tracking.go is shipments and their tracking: raw carrier events normalized at load, the
// prepared tracking views, and the two tracking operations.
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
		at          time.Time
		description string
	}
	var n normalization
	kept := make([]stamped, 0, len(raw))
	seen := make(map[identity]bool, len(raw))
	for _, e := range raw {
		var s string
		err := json.Unmarshal(e.Timestamp, &s)
		var at time.Time
		if err == nil {
			at, err = parseTimestamp(s)
		}
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
	view body
}

// shipmentIndex is a tenant's shipments, by id and by primary tracking number.
type shipmentIndex struct {
	byID             map[string]*shipment
	byTrackingNumber map[string]*shipment // nil value: the number is ambiguous
}

func newShipmentIndex() shipmentIndex {
	return shipmentIndex{byID: map[string]*shipment{}, byTrackingNumber: map[string]*shipment{}}
}

// addShipment checks one dataset shipment, normalizes its events, prepares its view and files it.
// A tracking number held by more than one shipment of the tenant is ambiguous.
func (ix *shipmentIndex) addShipment(path, where string, rec shipmentRecord) (normalization, error) {
	if err := checkShipment(path, rec); err != nil {
		return normalization{}, err
	}
	if ix.byID[rec.ID] != nil {
		return normalization{}, &datasetError{path: path + ".id", reason: fmt.Sprintf("duplicate shipment id %q in %s", rec.ID, where)}
	}
	raw := make([]rawEvent, len(rec.Events))
	for i, msg := range rec.Events {
		epath := fmt.Sprintf("%s.events[%d]", path, i)
		if err := decodeStrict(msg, epath, &raw[i]); err != nil {
			return normalization{}, err
		}
		if err := oneOf(epath+".status", "tracking status", raw[i].Status, trackingStatuses); err != nil {
			return normalization{}, err
		}
		if raw[i].Description == nil {
			return normalization{}, &datasetError{path: epath + ".description", reason: "required"}
		}
	}
	events, n := normalizeEvents(raw)
	status := "pre_transit"
	if len(events) > 0 {
		status = events[len(events)-1].Status
	}
	view, err := marshalJSON(trackingView{ShipmentID: rec.ID, Reference: rec.Reference, TrackingNumber: rec.TrackingNumber, Status: status, Events: events})
	if err != nil {
		return n, err
	}
	s := &shipment{view: bodyOf(view)}
	ix.byID[rec.ID] = s
	if number := rec.TrackingNumber; number != nil {
		if _, taken := ix.byTrackingNumber[*number]; taken {
			s = nil
		}
		ix.byTrackingNumber[*number] = s
	}
	return n, nil
}

// checkShipment checks a shipment's ids and numbers.
func checkShipment(path string, rec shipmentRecord) error {
	if err := checkID(path+".id", rec.ID); err != nil {
		return err
	}
	if err := checkID(path+".reference", rec.Reference); err != nil {
		return err
	}
	if rec.TrackingNumber != nil {
		if *rec.TrackingNumber == "" {
			return &datasetError{path: path + ".tracking_number", reason: "must not be empty; use null for a shipment without a tracking number"}
		}
		if err := checkID(path+".tracking_number", *rec.TrackingNumber); err != nil {
			return err
		}
	}
	if rec.OrderID != nil { // absent or null: no link; "" is no order id
		if err := checkID(path+".order_id", *rec.OrderID); err != nil {
			return err
		}
	}
	for i, p := range rec.ParcelTrackingNumbers {
		if err := checkID(fmt.Sprintf("%s.parcel_tracking_numbers[%d]", path, i), p); err != nil {
			return err
		}
	}
	return nil
}

var (
	errShipmentNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this ID exists in this account and environment."}
	errTrackingNotFound  = &apiError{code: codeNotFound, detail: "No shipment with this primary tracking number exists in this account and environment."}
	errTrackingAmbiguous = &apiError{code: codeNotFound, detail: "This tracking number belongs to more than one shipment in this account and environment; look the shipment up by its ID."}
)

// serveByID answers GET /v1/shipments/{id}/tracking.
func (ix *shipmentIndex) serveByID(w http.ResponseWriter, r *http.Request) error {
	s := ix.byID[r.PathValue("id")]
	if s == nil {
		return errShipmentNotFound
	}
	writeBody(w, http.StatusOK, jsonContentType, s.view)
	return nil
}

// serveByNumber answers GET /v1/tracking/{tracking_number}: an exact match on the primary
// tracking number within the key's account and environment.
func (ix *shipmentIndex) serveByNumber(w http.ResponseWriter, r *http.Request) error {
	s, known := ix.byTrackingNumber[r.PathValue("tracking_number")]
	switch {
	case s != nil:
		writeBody(w, http.StatusOK, jsonContentType, s.view)
		return nil
	case known:
		return errTrackingAmbiguous
	default:
		return errTrackingNotFound
	}
}
