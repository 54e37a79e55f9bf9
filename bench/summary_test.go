package main

import "testing"

func TestPairedRatio(t *testing.T) {
	res := &results{by: map[string]*series{}}
	// A host that is twice as fast in rounds 2 and 3: the ratio of
	// medians compares figures of different rounds (105/105 here), the
	// paired ratio the rounds' own (0.9, 0.9, 0.9, 0.7, 1.0).
	for _, v := range [][2]float64{{100, 90}, {200, 180}, {210, 189}, {100, 70}, {105, 105}} {
		res.add("drain-4", "raw", "msg/s", true, v[0])
		res.add("drain-4", "oncommit", "msg/s", true, v[1])
		res.add("latency", "raw", "ms", false, v[0])
		res.add("latency", "oncommit", "ms", false, v[1])
	}
	if got := res.pairedRatio(res.get("drain-4", "oncommit")); got < 0.8999 || got > 0.9001 {
		t.Errorf("paired ratio, higher is better = %v, want 0.9", got)
	}
	if got := res.pairedRatio(res.get("latency", "oncommit")); got < 1.111 || got > 1.112 {
		t.Errorf("paired ratio, lower is better = %v, want 1/0.9", got)
	}
	if got := res.ratio(res.get("drain-4", "oncommit")); got != 1 {
		t.Errorf("ratio of medians = %v, want 105/105 (the test's premise)", got)
	}
	if got := res.pairedRatio(res.get("drain-4", "raw")); got != 0 {
		t.Errorf("raw's paired ratio = %v, want 0", got)
	}
}
