package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The files -charts writes, one per chart.
const (
	exactnessChartFile  = "exactness.svg"
	throughputChartFile = "throughput.svg"
	latencyChartFile    = "latency.svg"
)

// chartWidth and chartHeight are every chart's size.
const (
	chartWidth  = 16 * vg.Centimeter
	chartHeight = 9 * vg.Centimeter
)

// exactnessChartModes are the exactness rows the exactness chart draws: the unbatched atomic
// engine against the pipelined one. The batched and cached rows, exact like atomic, would
// lie on its line and hide it.
var exactnessChartModes = []string{"atomic", "pipelined"}

// Colours: one per exactness mode, one for the throughput bars and one per latency percentile.
var (
	modeColors = map[string]color.Color{
		"atomic":    color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
		"pipelined": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	}
	barColor        = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	percentileColor = []color.Color{
		color.RGBA{R: 0x9e, G: 0xca, B: 0xe1, A: 0xff}, // light blue
		color.RGBA{R: 0x31, G: 0x82, B: 0xbd, A: 0xff}, // blue
		color.RGBA{R: 0x08, G: 0x30, B: 0x6b, A: 0xff}, // dark blue
	}
)

// writeCharts draws the run's figures as SVG files in dir, which it creates if need be:
// exactness.svg (admitted events per trailing window over time, atomic against pipelined,
// with the limit), throughput.svg (decisions/s per mode) and latency.svg (p50, p99 and p99.9
// per mode). A chart whose scenario did not run is left out. It returns the files written.
func writeCharts(dir string, r *Report) ([]string, error) {
	type chart struct {
		file string
		draw func(*Report) (*plot.Plot, error)
	}
	var charts []chart
	if len(chartedExactness(r.Exactness)) > 0 {
		charts = append(charts, chart{exactnessChartFile, exactnessChart})
	}
	if len(r.Throughput) > 0 {
		charts = append(charts, chart{throughputChartFile, throughputChart}, chart{latencyChartFile, latencyChart})
	}
	if len(charts) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, c := range charts {
		p, err := c.draw(r)
		if err != nil {
			return written, fmt.Errorf("chart %s: %w", c.file, err)
		}
		path := filepath.Join(dir, c.file)
		if err := p.Save(chartWidth, chartHeight, path); err != nil {
			return written, fmt.Errorf("chart %s: %w", c.file, err)
		}
		written = append(written, path)
	}
	return written, nil
}

// chartedExactness returns the exactness rows of exactnessChartModes that hold a trail, in
// that order.
func chartedExactness(rows []ExactnessRow) []ExactnessRow {
	var out []ExactnessRow
	for _, mode := range exactnessChartModes {
		for _, e := range rows {
			if e.Mode == mode && len(e.Trail) > 0 {
				out = append(out, e)
			}
		}
	}
	return out
}

// exactnessChart draws, for each charted exactness row, the admitted events in the trailing
// window over the seconds since the row's first request (each mode ran on its own, one after
// the other), as the step function analysis found, and the limit as a dashed line.
func exactnessChart(r *Report) (*plot.Plot, error) {
	cfg := r.Settings.Config
	rows := chartedExactness(r.Exactness)
	p := newPlot(fmt.Sprintf("Exactness: one key, %d goroutines, limit %d per %s", cfg.Concurrency, cfg.Limit, cfg.Window))
	p.X.Label.Text = "seconds since the mode's first request"
	p.Y.Label.Text = fmt.Sprintf("admitted in the trailing %s", cfg.Window)

	limit, end, highest := cfg.Limit, 0.0, 0
	for _, e := range rows {
		limit = e.Limit
		end = max(end, e.Trail[len(e.Trail)-1].Seconds)
		xys := make(plotter.XYs, len(e.Trail))
		for i, pt := range e.Trail {
			xys[i] = plotter.XY{X: pt.Seconds, Y: float64(pt.Admitted)}
			highest = max(highest, pt.Admitted)
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.StepStyle = plotter.PostStep
		l.Color = modeColors[e.Mode]
		l.Width = vg.Points(1.5)
		if e.Mode == "atomic" {
			l.Width = vg.Points(2.5) // wide enough to show under the limit's dashes, where it runs
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s: max in any window %d, overshoot %d, false denials %d",
			e.Mode, e.MaxInAnyWindow, e.Overshoot, e.FalseDenials), l)
	}

	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(limit)}, {X: end, Y: float64(limit)}})
	if err != nil {
		return nil, err
	}
	lim.Color = color.Black
	lim.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(lim)
	p.Legend.Add(fmt.Sprintf("limit %d", limit), lim)

	p.X.Min, p.X.Max = 0, end
	p.X.Tick.Marker = secondTicks{}
	p.Y.Min = 0
	p.Y.Max = 1.45 * float64(max(limit, highest)) // room for the legend above the lines
	p.Y.Tick.Marker = limitTicks(limit)
	return p, nil
}

// secondTicks marks a time axis in seconds at a round step (0.1, 0.2, 0.5, 1, 2, 5, 10, ...
// seconds) that gives 3 to 10 labelled ticks, with the step's halves between them unlabelled.
type secondTicks struct{}

// Ticks implements plot.Ticker.
func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	if hi <= lo {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	step := math.Pow(10, math.Floor(math.Log10(hi-lo)))
	for _, f := range []float64{1, 0.5, 0.2, 0.1} {
		if (hi-lo)/(step*f) >= 3 {
			step *= f
			break
		}
	}
	var ticks []plot.Tick
	for k := math.Ceil(2 * lo / step); k*step/2 <= hi; k++ {
		t := plot.Tick{Value: k * step / 2}
		if int(k)%2 == 0 {
			t.Label = strconv.FormatFloat(t.Value, 'g', 6, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// limitTicks marks an axis at every quarter of the limit, so that the limit is a labelled tick.
type limitTicks int

// Ticks implements plot.Ticker.
func (l limitTicks) Ticks(lo, hi float64) []plot.Tick {
	step := float64(l) / 4
	var ticks []plot.Tick
	for k := math.Ceil(lo / step); k*step <= hi; k++ {
		ticks = append(ticks, plot.Tick{Value: k * step, Label: strconv.FormatFloat(k*step, 'g', -1, 64)})
	}
	return ticks
}

// throughputLabel names a throughput row on a chart's axis: its mode and clock.
func throughputLabel(t ThroughputRow) string { return t.Mode + "\n" + t.Clock + " clock" }

// throughputChart draws decisions/s per throughput row, the figure over each bar; the axis
// names the one series.
func throughputChart(r *Report) (*plot.Plot, error) {
	rows := r.Throughput
	cfg := r.Settings.Config
	p := newPlot(fmt.Sprintf("Throughput: %d keys, %d goroutines over %d clients", rows[0].Keys, cfg.Concurrency, cfg.Clients))
	p.Y.Label.Text = "decisions/s"

	values := make(plotter.Values, len(rows))
	names := make([]string, len(rows))
	labels := plotter.XYLabels{XYs: make(plotter.XYs, len(rows)), Labels: make([]string, len(rows))}
	highest := 0.0
	for i, t := range rows {
		values[i] = t.DecisionsPerSec
		names[i] = throughputLabel(t)
		labels.XYs[i] = plotter.XY{X: float64(i), Y: t.DecisionsPerSec}
		labels.Labels[i] = strconv.FormatFloat(t.DecisionsPerSec, 'f', 0, 64)
		highest = max(highest, t.DecisionsPerSec)
	}
	bars, err := plotter.NewBarChart(values, vg.Points(40))
	if err != nil {
		return nil, err
	}
	bars.Color = barColor
	bars.LineStyle.Width = 0
	p.Add(bars)
	figures, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range figures.TextStyle {
		figures.TextStyle[i].XAlign = draw.XCenter
	}
	figures.Offset = vg.Point{Y: vg.Points(3)}
	p.Add(figures)
	p.NominalX(names...)
	insetBars(p, len(rows))
	p.Y.Min, p.Y.Max = 0, 1.2*highest
	return p, nil
}

// latencyChart draws p50, p99 and p99.9 latency in µs per throughput row, grouped by row.
func latencyChart(r *Report) (*plot.Plot, error) {
	rows := r.Throughput
	cfg := r.Settings.Config
	p := newPlot(fmt.Sprintf("Latency: %d keys, %d goroutines over %d clients", rows[0].Keys, cfg.Concurrency, cfg.Clients))
	p.Y.Label.Text = "latency (µs)"

	percentiles := []struct {
		name string
		of   func(ThroughputRow) float64
	}{
		{"p50", func(t ThroughputRow) float64 { return t.P50us }},
		{"p99", func(t ThroughputRow) float64 { return t.P99us }},
		{"p99.9", func(t ThroughputRow) float64 { return t.P999us }},
	}
	const width = 18
	highest := 0.0
	for k, pc := range percentiles {
		values := make(plotter.Values, len(rows))
		for i, t := range rows {
			values[i] = pc.of(t)
			highest = max(highest, values[i])
		}
		bars, err := plotter.NewBarChart(values, vg.Points(width))
		if err != nil {
			return nil, err
		}
		bars.Color = percentileColor[k%len(percentileColor)]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Points(width * float64(k-(len(percentiles)-1)/2))
		p.Add(bars)
		p.Legend.Add(pc.name, bars)
	}
	names := make([]string, len(rows))
	for i, t := range rows {
		names[i] = throughputLabel(t)
	}
	p.NominalX(names...)
	insetBars(p, len(rows))
	p.Y.Min, p.Y.Max = 0, 1.35*highest // room for the legend above the bars
	return p, nil
}

// insetBars widens a bar chart's X axis by half a bar group each side, so that the first and
// last groups' names stay inside the picture also where the SVG's font (Liberation Serif) is
// missing and a wider one stands in.
func insetBars(p *plot.Plot, groups int) {
	p.X.Min, p.X.Max = -0.75, float64(groups)-0.25
}

// newPlot returns a plot with the title, a grid and the legend at the top left, its names
// after their keys: a stand-in font wider than the SVG's then runs into the plot, not off it.
func newPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(6)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	return p
}
