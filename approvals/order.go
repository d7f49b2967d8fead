package approvals

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The actions an OrderChange describes.
const (
	ActionCreate = "create"
	ActionChange = "change"
	ActionCancel = "cancel"
)

// OrderChange is an approval's structured diff in the order's own terms,
// for a person at an order desk: which order, whose, each changed field
// its own row (order lines matched by SKU, the address field by field),
// and the total before and after in its currency. It is read from the
// approval's structured diff and resource (the order as it was when the
// approval was asked), never from the diff's text.
type OrderChange struct {
	Action     string // ActionCreate, ActionChange or ActionCancel
	OrderID    string // the order changed or cancelled; "" for a create, or when the approval kept no resource
	CustomerID string
	Currency   string
	// Status is the order's status when the approval was asked ("" for a
	// create); CancelReason is the reason a cancel gives.
	Status       string
	CancelReason string
	// Rows are what changes, one field each: for a create every line and
	// field of the new order, for a change the lines (by SKU: quantity,
	// unit price, a line added or removed) then the other fields, for a
	// cancel the status.
	Rows []Row
	// Lines are the order's lines as they stand before the operation (a
	// change's, a cancel's: what is cancelled) or, for a create, the new
	// order's.
	Lines []Line
	// TotalBefore and TotalAfter are the order's total before and after,
	// in minor units of Currency: a create has no before, a cancel no
	// after; nil when not known.
	TotalBefore, TotalAfter *int64
}

// Row is one changed field, its values as a person reads them; "" is no
// value (a line added has no Before, a line removed no After).
type Row struct {
	What, Before, After string
}

// Line is one order line.
type Line struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceMinor int64  `json:"unit_price_minor"`
}

// orderDoc is the part of an order (or a create's request) the view reads.
type orderDoc struct {
	OrderID      string  `json:"order_id"`
	Status       string  `json:"status"`
	CustomerID   string  `json:"customer_id"`
	Currency     string  `json:"currency"`
	Items        []Line  `json:"items"`
	TotalMinor   *int64  `json:"total_minor"`
	ShipTo       address `json:"ship_to"`
	Delivery     string  `json:"requested_delivery_date"`
	Note         string  `json:"note"`
	CancelReason string  `json:"cancel_reason"`
}

type address map[string]string

// addressFields are an address's fields in the order a label is read.
var addressFields = []struct{ key, label string }{
	{"name", "name"}, {"line1", "street"}, {"line2", "street (2)"}, {"city", "city"},
	{"region", "region"}, {"postal_code", "postal code"}, {"country", "country"},
}

// DescribeOrder is the diff of an approval of tool (create_order,
// update_order, cancel_order) in the order's terms, from the approval's
// structured diff ([]Change as JSON) and resource (the order when asked,
// empty for a create). false when tool is not one of them or the diff
// cannot be read.
func DescribeOrder(tool string, diff, resource json.RawMessage) (*OrderChange, bool) {
	var changes []struct {
		Path   string          `json:"path"`
		Before json.RawMessage `json:"before"`
		After  json.RawMessage `json:"after"`
	}
	if json.Unmarshal(diff, &changes) != nil {
		return nil, false
	}
	var cur orderDoc
	if len(resource) > 0 && json.Unmarshal(resource, &cur) != nil {
		return nil, false
	}
	oc := &OrderChange{OrderID: cur.OrderID, CustomerID: cur.CustomerID, Currency: cur.Currency, Status: cur.Status, Lines: cur.Items}
	switch tool {
	case "create_order":
		oc.Action, oc.Status, oc.Lines = ActionCreate, "", nil
		var n orderDoc
		for _, c := range changes {
			// Each field of the new order is one change; read them as one
			// document.
			if raw, err := json.Marshal(map[string]json.RawMessage{c.Path: c.After}); err == nil {
				json.Unmarshal(raw, &n)
			}
		}
		oc.CustomerID, oc.Currency, oc.Lines, oc.TotalAfter = n.CustomerID, n.Currency, n.Items, n.TotalMinor
		for _, l := range n.Items {
			oc.Rows = append(oc.Rows, Row{What: "line " + l.SKU, After: oc.line(l)})
		}
		oc.Rows = append(oc.Rows, addressRows(nil, n.ShipTo)...)
		oc.Rows = appendIf(oc.Rows, "requested delivery date", "", n.Delivery)
		oc.Rows = appendIf(oc.Rows, "note", "", n.Note)
	case "update_order":
		oc.Action = ActionChange
		oc.TotalBefore, oc.TotalAfter = cur.TotalMinor, cur.TotalMinor
		for _, c := range changes {
			switch c.Path {
			case "items":
				var before, after []Line
				json.Unmarshal(c.Before, &before)
				json.Unmarshal(c.After, &after)
				oc.Rows = append(oc.Rows, oc.lineRows(before, after)...)
			case "total_minor":
				var before, after *int64
				json.Unmarshal(c.Before, &before)
				json.Unmarshal(c.After, &after)
				oc.TotalBefore, oc.TotalAfter = before, after
			case "ship_to":
				var before, after address
				json.Unmarshal(c.Before, &before)
				json.Unmarshal(c.After, &after)
				oc.Rows = append(oc.Rows, addressRows(before, after)...)
			default:
				oc.Rows = append(oc.Rows, Row{What: strings.ReplaceAll(c.Path, "_", " "), Before: plain(c.Before), After: plain(c.After)})
			}
		}
	case "cancel_order":
		oc.Action, oc.TotalBefore = ActionCancel, cur.TotalMinor
		for _, c := range changes {
			switch c.Path {
			case "cancel_reason":
				oc.CancelReason = plain(c.After)
			default:
				oc.Rows = append(oc.Rows, Row{What: strings.ReplaceAll(c.Path, "_", " "), Before: plain(c.Before), After: plain(c.After)})
			}
		}
	default:
		return nil, false
	}
	return oc, true
}

// lineRows are the rows of a change of the lines from before to after:
// lines are matched by SKU (the n-th line of a SKU with its n-th line, if
// an order repeats one), each changed quantity and unit price its own
// row, then the lines added and the lines removed.
func (oc *OrderChange) lineRows(before, after []Line) []Row {
	var rows []Row
	used := make([]bool, len(before))
	match := func(sku string) int {
		for i, b := range before {
			if !used[i] && b.SKU == sku {
				used[i] = true
				return i
			}
		}
		return -1
	}
	var added []Row
	for _, a := range after {
		i := match(a.SKU)
		if i < 0 {
			added = append(added, Row{What: "line " + a.SKU + " added", After: oc.line(a)})
			continue
		}
		b := before[i]
		if b.Quantity != a.Quantity {
			rows = append(rows, Row{What: a.SKU + " quantity", Before: fmt.Sprint(b.Quantity), After: fmt.Sprint(a.Quantity)})
		}
		if b.UnitPriceMinor != a.UnitPriceMinor {
			rows = append(rows, Row{What: a.SKU + " unit price", Before: Money(b.UnitPriceMinor, oc.Currency), After: Money(a.UnitPriceMinor, oc.Currency)})
		}
	}
	rows = append(rows, added...)
	for i, b := range before {
		if !used[i] {
			rows = append(rows, Row{What: "line " + b.SKU + " removed", Before: oc.line(b)})
		}
	}
	return rows
}

// line is one line as a person reads it: "2 × 12.50 EUR".
func (oc *OrderChange) line(l Line) string {
	return fmt.Sprintf("%d × %s", l.Quantity, Money(l.UnitPriceMinor, oc.Currency))
}

// LineText is l as a person reads it: "TEA-001: 2 × 12.50 EUR".
func (oc *OrderChange) LineText(l Line) string { return l.SKU + ": " + oc.line(l) }

// addressRows are the rows of a ship-to address changed from before to
// after (nil: none), field by field.
func addressRows(before, after address) []Row {
	var rows []Row
	for _, f := range addressFields {
		rows = appendIf(rows, "ship to "+f.label, before[f.key], after[f.key])
	}
	return rows
}

// appendIf appends the row what when before and after differ.
func appendIf(rows []Row, what, before, after string) []Row {
	if before == after {
		return rows
	}
	return append(rows, Row{What: what, Before: before, After: after})
}

// plain is a JSON value as a person reads it: a string as is, null as "".
func plain(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if string(raw) == "null" {
		return ""
	}
	return string(raw)
}

// Headline says what the operation does, in words: "Change order ord_1
// for customer cust-42", "Cancel order …", "Place an order for customer
// cust-42".
func (oc *OrderChange) Headline() string {
	customer := ""
	if oc.CustomerID != "" {
		customer = " for customer " + oc.CustomerID
	}
	order := "an order"
	if oc.OrderID != "" {
		order = "order " + oc.OrderID
	}
	switch oc.Action {
	case ActionCreate:
		return "Place an order" + customer
	case ActionCancel:
		return "Cancel " + order + customer
	}
	return "Change " + order + customer
}

// Money shows an amount in minor units with its currency: "37.00 EUR",
// "1200 JPY".
func Money(minor int64, currency string) string {
	if noMinorUnit[strings.ToUpper(currency)] {
		return fmt.Sprintf("%d %s", minor, currency)
	}
	sign, n := "", uint64(minor)
	if minor < 0 {
		sign, n = "-", uint64(-minor) // -MinInt64 wraps to its own magnitude as uint64
	}
	return strings.TrimSpace(fmt.Sprintf("%s%d.%02d %s", sign, n/100, n%100, currency))
}

// noMinorUnit are the currencies whose amounts have no decimals.
var noMinorUnit = map[string]bool{"JPY": true, "KRW": true, "VND": true, "CLP": true, "ISK": true, "UGX": true, "XAF": true, "XOF": true}

// Difference is TotalAfter − TotalBefore with its sign, in currency
// ("+37.50 EUR", "-9.00 EUR", "no change"); "" when either is unknown.
func (oc *OrderChange) Difference() string {
	if oc.TotalBefore == nil || oc.TotalAfter == nil {
		return ""
	}
	d := *oc.TotalAfter - *oc.TotalBefore
	switch {
	case d == 0:
		return "no change"
	case d > 0:
		return "+" + Money(d, oc.Currency)
	}
	return Money(d, oc.Currency)
}

// Words is the change as a few lines of text, for a notice: the headline,
// a cancel's reason, each row, the lines a cancel cancels, the total.
func (oc *OrderChange) Words() string {
	var b strings.Builder
	b.WriteString(oc.Headline())
	if oc.CancelReason != "" {
		fmt.Fprintf(&b, "\nReason: %s", oc.CancelReason)
	}
	for _, r := range oc.Rows {
		switch {
		case r.Before == "":
			fmt.Fprintf(&b, "\n%s: %s", r.What, r.After)
		case r.After == "":
			fmt.Fprintf(&b, "\n%s: %s", r.What, r.Before)
		default:
			fmt.Fprintf(&b, "\n%s: %s → %s", r.What, r.Before, r.After)
		}
	}
	if oc.Action == ActionCancel {
		for _, l := range oc.Lines {
			fmt.Fprintf(&b, "\ncancelled line %s", oc.LineText(l))
		}
	}
	switch {
	case oc.Action == ActionCancel && oc.TotalBefore != nil:
		fmt.Fprintf(&b, "\nTotal cancelled: %s", Money(*oc.TotalBefore, oc.Currency))
	case oc.TotalBefore != nil && oc.TotalAfter != nil && *oc.TotalBefore != *oc.TotalAfter:
		fmt.Fprintf(&b, "\nTotal: %s → %s (%s)", Money(*oc.TotalBefore, oc.Currency), Money(*oc.TotalAfter, oc.Currency), oc.Difference())
	case oc.TotalAfter != nil:
		fmt.Fprintf(&b, "\nTotal: %s", Money(*oc.TotalAfter, oc.Currency))
	}
	return b.String()
}

// Why is why an approval was asked, for a person: the policy's reason as
// it is, except that a suspected duplicate — whose recorded reason is
// only the rule's name — says what it duplicates.
func Why(rule, reason, earlierKey string) string {
	if rule == "suspected_duplicate" {
		return "the same request as the earlier operation " + earlierKey + " under a new operation key: a retry that minted a new key, or a genuine second order"
	}
	return reason
}
