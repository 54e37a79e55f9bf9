package outbox

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkCheckJSON measures the payload check alone on a small payload
// (BenchmarkPublish's) and a 4 KiB one with numbers, escapes and nesting:
//
//	go test ./outbox -run '^$' -bench CheckJSON -count 6
func BenchmarkCheckJSON(b *testing.B) {
	var big strings.Builder
	big.WriteString(`{"items":[`)
	for i := 0; big.Len() < 4<<10; i++ {
		if i > 0 {
			big.WriteByte(',')
		}
		big.WriteString(`{"sku":"A-` + strconv.Itoa(i) + `","name":"caf\u00e9 \ud83d\ude00 \"x\"","qty":` + strconv.Itoa(i) + `,"price":12.50,"rate":-1.5e-3,"tags":["a","b"]}`)
	}
	big.WriteString(`]}`)
	for _, p := range []struct{ name, json string }{
		{"small", `{"order_id":"0193a1f2","email":"someone@example.com","total_cents":4200}`},
		{"4KiB", big.String()},
	} {
		b.Run(p.name, func(b *testing.B) {
			payload := []byte(p.json)
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if r := checkJSON(payload, MaxPayloadDepth); r != "" {
					b.Fatal(r)
				}
			}
		})
	}
}
