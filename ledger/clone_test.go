package ledger

import (
	"reflect"
	"testing"
)

// TestRecordCloneSharesNothing: Record.clone copies every slice, map and
// pointer a Record holds, at any depth, so a field added to Record (or to
// OpError, Approval) that clone forgets fails here rather than letting a
// replay's caller change the record kept for the next replay.
func TestRecordCloneSharesNothing(t *testing.T) {
	var r Record
	fill(reflect.ValueOf(&r).Elem())
	c := r.clone()
	if !reflect.DeepEqual(&r, c) {
		t.Fatalf("clone differs from its record:\n got %+v\nwant %+v", c, &r)
	}
	shared(t, "Record", reflect.ValueOf(r), reflect.ValueOf(*c))
}

// fill gives every slice, map and pointer in v (recursively) a non-nil,
// non-empty value.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(e)
		v.SetMapIndex(k, e)
	case reflect.String:
		v.SetString("x")
	case reflect.Uint8, reflect.Uint64:
		v.SetUint(1)
	case reflect.Int:
		v.SetInt(1)
	}
}

// shared fails when a and b (a value and its clone) share the memory of
// any slice, map or pointer.
func shared(t *testing.T, path string, a, b reflect.Value) {
	t.Helper()
	switch a.Kind() {
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				shared(t, path+"."+a.Type().Field(i).Name, a.Field(i), b.Field(i))
			}
		}
	case reflect.Pointer, reflect.Map:
		if !a.IsNil() && a.UnsafePointer() == b.UnsafePointer() {
			t.Errorf("%s is shared by the record and its clone", path)
		}
		if a.Kind() == reflect.Pointer && !a.IsNil() {
			shared(t, path, a.Elem(), b.Elem())
		}
	case reflect.Slice:
		if a.Len() > 0 && a.UnsafePointer() == b.UnsafePointer() {
			t.Errorf("%s is shared by the record and its clone", path)
		}
	}
}
