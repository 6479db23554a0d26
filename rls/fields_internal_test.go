package rls

// FieldsKept is how many limits' header fields s keeps: what the tests of package rls_test
// read to see that clients cannot grow it.
func FieldsKept(s *Service) int {
	n := 0
	s.fields.Range(func(any, any) bool {
		n++
		return true
	})
	return n
}
