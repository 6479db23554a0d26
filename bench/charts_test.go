package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// chartReport is a small fixed run: an exact atomic row and a pipelined one that overshoots
// by 2 and then starves, and four throughput rows.
func chartReport() *Report {
	return &Report{
		Settings: Settings{Config: config{Concurrency: 64, Clients: 4, Keys: 10_000, Limit: 100, Window: time.Second}},
		Exactness: []ExactnessRow{
			{Mode: "atomic", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 100},
				Trail: []TrailPoint{{0, 100}, {1, 99}, {1.0001, 100}, {2.5, 100}}},
			{Mode: "batched", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 100},
				Trail: []TrailPoint{{0, 100}, {2.5, 100}}},
			{Mode: "pipelined", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 102, Overshoot: 2, FalseDenials: 31},
				Trail: []TrailPoint{{0, 102}, {1, 0}, {2.4, 0}}},
		},
		Throughput: []ThroughputRow{
			{Mode: "atomic", Clock: "server", Keys: 10_000, DecisionsPerSec: 62396, P50us: 920, P99us: 2756, P999us: 5762},
			{Mode: "atomic", Clock: "caller", Keys: 10_000, DecisionsPerSec: 63689, P50us: 900, P99us: 2771, P999us: 5852},
			{Mode: "batched", Clock: "server", Keys: 10_000, DecisionsPerSec: 81396, P50us: 757, P99us: 1577, P999us: 4889},
			{Mode: "pipelined", Clock: "caller", Keys: 10_000, DecisionsPerSec: 74085, P50us: 732, P99us: 4903, P999us: 8365},
		},
	}
}

// svgTexts parses an SVG file as XML and returns its root element's name and the text of
// every <text> element, in order; an error if it is not well-formed.
func svgTexts(path string) (root string, texts []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return root, texts, nil
		}
		if err != nil {
			return root, texts, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				inText = true
				texts = append(texts, "")
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				inText = false
			}
		case xml.CharData:
			if inText {
				texts[len(texts)-1] += string(tok)
			}
		}
	}
}

func TestWriteChartsNamesEverySeries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts") // made by writeCharts
	files, err := writeCharts(dir, chartReport())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		exactnessChartFile: {
			"Exactness: one key, 64 goroutines, limit 100 per 1s",
			"atomic: max in any window 100, overshoot 0, false denials 0",
			"pipelined: max in any window 102, overshoot 2, false denials 31",
			"limit 100",
			"admitted in the trailing 1s",
		},
		throughputChartFile: {"decisions/s", "62396", "63689", "81396", "74085", "atomic", "batched", "pipelined", "server clock", "caller clock"},
		latencyChartFile:    {"p50", "p99", "p99.9", "latency (µs)", "atomic", "batched", "pipelined", "server clock", "caller clock"},
	}
	if len(files) != len(want) {
		t.Fatalf("wrote %v, want %d files", files, len(want))
	}
	for _, path := range files {
		root, texts, err := svgTexts(path)
		if err != nil {
			t.Errorf("%s is not well-formed XML: %v", path, err)
			continue
		}
		if root != "svg" {
			t.Errorf("%s: root element <%s>, want <svg>", path, root)
		}
		names, ok := want[filepath.Base(path)]
		if !ok {
			t.Errorf("unexpected chart %s", path)
			continue
		}
		for _, name := range names {
			if !slices.Contains(texts, name) {
				t.Errorf("%s names no %q; its texts: %q", filepath.Base(path), name, texts)
			}
		}
		// The batched row is exact like atomic and left off the exactness chart.
		if filepath.Base(path) == exactnessChartFile && slices.ContainsFunc(texts, func(s string) bool { return strings.HasPrefix(s, "batched") }) {
			t.Errorf("%s draws the batched row: %q", path, texts)
		}
	}
}

func TestExactnessChartFitsTheOvershoot(t *testing.T) {
	p, err := exactnessChart(chartReport())
	if err != nil {
		t.Fatal(err)
	}
	if p.Y.Min != 0 || p.Y.Max < 102 || p.X.Min != 0 || p.X.Max != 2.5 {
		t.Errorf("axes x [%v, %v], y [%v, %v]: want x [0, 2.5] and y from 0 past the peak of 102",
			p.X.Min, p.X.Max, p.Y.Min, p.Y.Max)
	}
}

func TestWriteChartsWithoutTheirScenarios(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts")
	r := chartReport()
	r.Exactness, r.Throughput = nil, nil
	r.Memory = []MemoryRow{{Mode: "atomic", Limit: 10}}
	files, err := writeCharts(dir, r)
	if err != nil || len(files) != 0 {
		t.Fatalf("writeCharts = %v, %v; want no files", files, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("made %s with nothing to put in it (%v)", dir, err)
	}
}

func TestSecondTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []string // the labelled ticks
	}{
		{0, 5.004, []string{"0", "1", "2", "3", "4", "5"}},
		{0, 2.5, []string{"0", "0.5", "1", "1.5", "2", "2.5"}},
		{0, 0.4, []string{"0", "0.1", "0.2", "0.3", "0.4"}},
		{0, 30, []string{"0", "10", "20", "30"}},
		{0, 60.2, []string{"0", "10", "20", "30", "40", "50", "60"}},
	} {
		var got []string
		for _, tk := range (secondTicks{}).Ticks(c.lo, c.hi) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Ticks(%v, %v) labels %q, want %q", c.lo, c.hi, got, c.want)
		}
	}
}
