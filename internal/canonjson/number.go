package canonjson

import (
	"strconv"
)

const (
	// maxExponent bounds the exponent of a canonical number: |e| < 10^9.
	maxExponent = 1_000_000_000
	// maxExponentDigits bounds the digits of an exponent as written, which
	// keeps the exponent arithmetic far from overflow.
	maxExponentDigits = 18
)

// number parses a JSON number and writes it as the shortest exact decimal.
// The value is never converted to a float, so nothing is rounded.
func (p *parser) number() error {
	start := p.pos
	neg := p.src[p.pos] == '-'
	if neg {
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(p.src) && p.src[p.pos] == '0':
		p.pos++
	case p.pos < len(p.src) && p.src[p.pos] >= '1' && p.src[p.pos] <= '9':
		p.skipDigits()
	default:
		return p.fail(p.pos, "invalid number")
	}
	intDigits := p.src[intStart:p.pos]

	var fracDigits []byte
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		fracStart := p.pos
		if p.skipDigits() == 0 {
			return p.fail(p.pos, "invalid number: no digits after the decimal point")
		}
		fracDigits = p.src[fracStart:p.pos]
	}

	exp := 0
	if p.pos < len(p.src) && (p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
		p.pos++
		expNeg := false
		if p.pos < len(p.src) && (p.src[p.pos] == '+' || p.src[p.pos] == '-') {
			expNeg = p.src[p.pos] == '-'
			p.pos++
		}
		expStart := p.pos
		if p.skipDigits() == 0 {
			return p.fail(p.pos, "invalid number: no digits in the exponent")
		}
		digits := trimLeadingZeros(p.src[expStart:p.pos])
		if len(digits) > maxExponentDigits {
			return p.fail(start, "number exponent out of range")
		}
		if len(digits) > 0 {
			exp, _ = strconv.Atoi(string(digits))
		}
		if expNeg {
			exp = -exp
		}
	}
	out, ok := appendDecimal(p.buf, neg, intDigits, fracDigits, exp)
	if !ok {
		return p.fail(start, "number exponent out of range")
	}
	p.buf = out
	return nil
}

func (p *parser) skipDigits() int {
	n := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

func trimLeadingZeros(d []byte) []byte {
	for len(d) > 0 && d[0] == '0' {
		d = d[1:]
	}
	return d
}

// appendDecimal writes ±(intDigits.fracDigits)×10^exp in canonical form. It
// reports false when the canonical exponent would have more than
// maxExponentDigits digits.
func appendDecimal(dst []byte, neg bool, intDigits, fracDigits []byte, exp int) ([]byte, bool) {
	// The value is mantissa × 10^exp with mantissa an integer without
	// leading or trailing zeros.
	mantissa := make([]byte, 0, len(intDigits)+len(fracDigits))
	mantissa = append(append(mantissa, intDigits...), fracDigits...)
	exp -= len(fracDigits)
	mantissa = trimLeadingZeros(mantissa)
	for len(mantissa) > 0 && mantissa[len(mantissa)-1] == '0' {
		mantissa = mantissa[:len(mantissa)-1]
		exp++
	}
	if len(mantissa) == 0 {
		return append(dst, '0'), true // -0 is 0
	}
	if neg {
		dst = append(dst, '-')
	}
	point := len(mantissa) + exp // digits before the decimal point
	switch {
	case exp >= 0 && point <= 21:
		dst = append(dst, mantissa...)
		for range exp {
			dst = append(dst, '0')
		}
	case point > 0 && point <= 21:
		dst = append(dst, mantissa[:point]...)
		dst = append(dst, '.')
		dst = append(dst, mantissa[point:]...)
	case point > -6 && point <= 0:
		dst = append(dst, '0', '.')
		for range -point {
			dst = append(dst, '0')
		}
		dst = append(dst, mantissa...)
	default:
		if e := point - 1; e >= maxExponent || e <= -maxExponent {
			return dst, false
		}
		dst = append(dst, mantissa[0])
		if len(mantissa) > 1 {
			dst = append(dst, '.')
			dst = append(dst, mantissa[1:]...)
		}
		dst = append(dst, 'e')
		if point-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(point-1), 10)
	}
	return dst, true
}
