package route

import "encoding/json"

// decodeMembers sets *v to what json.Unmarshal would make of data as far
// as a rule reading the members named in names can tell: for an object, a
// map holding those of its members that are there (the last of a name
// that is there twice, as json.Unmarshal keeps); for anything else, all of
// it. A body that is not JSON gives json.Unmarshal's own error. The
// members not named are checked as JSON but not decoded: a routed body is
// mostly data the rules never look at, and building its values was most
// of what judging it cost. (So a number too large for a float64 in a
// member no rule reads no longer makes the body unreadable.) A map already
// in *v is emptied and filled, so that judging a message need not make one.
func decodeMembers(data []byte, names map[string]bool, v *any) error {
	if !json.Valid(data) {
		return json.Unmarshal(data, v)
	}
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return json.Unmarshal(data, v)
	}
	obj, ok := (*v).(map[string]any)
	if ok {
		clear(obj)
	} else {
		obj = map[string]any{}
	}
	*v = obj
	i = skipSpace(data, i+1)
	if data[i] == '}' {
		return nil
	}
	for {
		// data is valid JSON: a member is "name" : value, then ',' or '}'.
		start, end := i, skipString(data, i)
		name := data[start+1 : end-1]
		plain := plainText(name)
		i = skipSpace(data, end)
		i = skipSpace(data, i+1) // the ':'
		valueEnd := skipValue(data, i)
		var key string
		wanted := plain && names[string(name)]
		if wanted {
			key = string(name)
		} else if !plain {
			// Escapes or non-ASCII in the name: compared as decoded.
			if err := json.Unmarshal(data[start:end], &key); err != nil {
				return err
			}
			wanted = names[key]
		}
		if wanted {
			m, err := decodeValue(data[i:valueEnd])
			if err != nil {
				return err
			}
			obj[key] = m
		}
		i = skipSpace(data, valueEnd)
		if data[i] == '}' {
			return nil
		}
		i = skipSpace(data, i+1)
	}
}

// decodeValue is json.Unmarshal's value of the valid JSON value b, made
// without it for the usual scalars: a string without escapes or non-ASCII,
// true, false and null (a number is a float64 as it makes it).
func decodeValue(b []byte) (any, error) {
	switch b[0] {
	case '"':
		if s := b[1 : len(b)-1]; plainText(s) {
			return string(s), nil
		}
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case 'n':
		return nil, nil
	}
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}

// plainText says whether the inside of a JSON string is its text as it
// is: no escape, and ASCII only (json.Unmarshal replaces invalid UTF-8).
func plainText(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// The skips below read only data that json.Valid accepted, so every index
// they reach is inside it.

// skipSpace is the index of the first byte from data[i] on that is not
// JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString is the index just past the string that starts at data[i].
func skipString(data []byte, i int) int {
	for i++; ; i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// skipValue is the index just past the value that starts at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch data[i] {
			case '"':
				i = skipString(data, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default:
		for i < len(data) {
			switch data[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}
