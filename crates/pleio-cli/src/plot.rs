//! SVG charts: gather latency per batch size, per-ubatch latency over a
//! replay, and a page-cache residency heat strip.
//!
//! Drawn with `plotters`' SVG backend only: no bitmap, font or system
//! libraries. Text goes into the SVG as `<text>` for the viewer to render.
//! Every chart is written by [`crate::outfile`]'s rules (a temporary file
//! renamed into place) and replaces an existing regular file of the same
//! name, never a symbolic link or a device.

// Used by `pleio demo` (latency and ubatch charts) and `pleio residency`.

use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::outfile::{write_file, Replace};

/// Chart size in pixels.
const SIZE: (u32, u32) = (960, 600);
/// Heat strip size in pixels.
const STRIP_SIZE: (u32, u32) = (960, 260);
const FONT: &str = "sans-serif";

/// Series colours: the Okabe-Ito palette (distinguishable with colour
/// blindness), black kept for the `limit` line, plus an olive, a violet,
/// a crimson and a slate so every strategy of a build, and the warm
/// charts' `limit-warm`, has its own colour.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(140, 140, 40),
    RGBColor(110, 70, 200),
    RGBColor(170, 30, 60),
    RGBColor(90, 110, 120),
];

/// Legend and line label of the `limit` reference line: the floor runs at
/// the fastest queue depth of its sweep (`pleio_lab::floor::QUEUE_DEPTHS`).
pub const LIMIT_LABEL: &str = "limit (device floor: O_DIRECT, fastest QD of 16-256)";

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn draw_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// Renders `draw` onto an SVG of `size` and writes it to `out` atomically.
fn render(
    out: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<()>,
) -> Result<()> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        draw(&root)?;
        root.present().map_err(draw_err)?;
    }
    write_file(out, Replace::Always, |w| w.write_all(svg.as_bytes()))
}

/// `lo..hi` widened by `factor` on each side of a log axis.
fn log_span(lo: f64, hi: f64, factor: f64) -> Range<f64> {
    lo / factor..hi * factor
}

/// A duration in microseconds as `12 µs`, `1.5 ms` or `2 s`.
fn us_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", trim_float(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", trim_float(us / 1e3))
    } else {
        format!("{} µs", trim_float(us))
    }
}

/// Up to three significant figures, no trailing zeros.
fn trim_float(x: f64) -> String {
    let s = if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Most ticks on an axis.
const MAX_TICKS: usize = 12;

/// X ticks of a latency chart: the batch sizes measured (at most
/// [`MAX_TICKS`], evenly thinned), so each is labelled exactly.
fn batch_ticks(xs: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    if v.len() <= MAX_TICKS {
        return v;
    }
    let last = v.len() - 1;
    (0..MAX_TICKS)
        .map(|i| v[i * last / (MAX_TICKS - 1)])
        .collect()
}

/// Ticks of a log axis over `r`: 1-2-5 steps per decade, decades only when
/// the range is wide, finer steps when it is narrow, so a few always show.
fn log_ticks(r: Range<f64>) -> Vec<f64> {
    let ladder = |mantissas: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        let mut decade = 10f64.powf(r.start.log10().floor());
        while decade <= r.end {
            out.extend(
                mantissas
                    .iter()
                    .map(|m| m * decade)
                    .filter(|v| r.contains(v)),
            );
            decade *= 10.0;
        }
        out
    };
    let fine = [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
    [&[1.0, 2.0, 5.0][..], &[1.0], &fine]
        .iter()
        .map(|m| ladder(m))
        .find(|t| (3..=MAX_TICKS).contains(&t.len()))
        .unwrap_or_else(|| ladder(&fine))
}

/// Points a log-log chart can show: positive, finite.
fn loggable(points: &[(u64, f64)]) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|&&(x, y)| x > 0 && y.is_finite() && y > 0.0)
        .map(|&(x, y)| (x as f64, y))
        .collect()
}

/// Latency per batch against rows per batch, both on log scales: one line
/// with point markers per strategy, `limit` (the device floor measured in
/// the same run) as a dashed black reference line, and a legend.
///
/// `series` holds `(strategy name, [(rows per batch, latency in µs)])`.
/// Points that a log scale cannot show (zero rows, non-positive or
/// non-finite latency) are left out; no point at all is an error.
pub fn latency_chart<S: AsRef<str>>(
    out: &Path,
    title: &str,
    series: &[(S, Vec<(u64, f64)>)],
    limit: Option<&[(u64, f64)]>,
) -> Result<()> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, pts)| (name.as_ref(), loggable(pts)))
        .collect();
    let limit = limit.map(loggable).filter(|l| !l.is_empty());
    let all = || {
        lines
            .iter()
            .flat_map(|(_, p)| p)
            .chain(limit.iter().flatten())
    };
    let Some(first) = all().next() else {
        bail!("no latency to plot (every series empty)");
    };
    let (mut x0, mut x1, mut y0, mut y1) = (first.0, first.0, first.1, first.1);
    for &(x, y) in all() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    render(out, SIZE, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d(
                log_span(x0, x1, 1.3)
                    .log_scale()
                    .with_key_points(batch_ticks(all().map(|p| p.0))),
                log_span(y0, y1, 1.6)
                    .log_scale()
                    .with_key_points(log_ticks(log_span(y0, y1, 1.6))),
            )
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("rows per batch (log scale)")
            .y_desc("latency per batch (log scale)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| us_label(*v))
            .axis_desc_style((FONT, 18))
            .label_style((FONT, 15))
            .draw()
            .map_err(draw_err)?;
        draw_lines(&mut chart, &lines, Some(4))?;
        if let Some(l) = &limit {
            chart
                .draw_series(DashedLineSeries::new(
                    l.iter().copied(),
                    8,
                    6,
                    BLACK.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(LIMIT_LABEL)
                .legend(|(x, y)| PathElement::new([(x, y), (x + 10, y)], BLACK.stroke_width(2)));
            chart
                .draw_series(l.iter().map(|&p| Cross::new(p, 5, BLACK.stroke_width(2))))
                .map_err(draw_err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// Draws one labelled line per series, in the series' colour, with point
/// markers of `marker` radius when given.
fn draw_lines<'a, 'b: 'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    lines: &[(&str, Vec<(f64, f64)>)],
    marker: Option<i32>,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(draw_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], c.stroke_width(2)));
        if let Some(r) = marker {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, r, c.filled())))
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// Draws the legend box of `chart`.
fn legend<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    at: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(at)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(draw_err)
}

/// Latency of each ubatch over a replay, in order: one line per strategy
/// (point markers too when there are few ubatches), linear axes from zero.
///
/// `series` holds `(strategy name, [latency in ms of ubatch 0, 1, ...])`.
/// Non-finite or negative latencies are left out.
pub fn ubatch_chart<S: AsRef<str>>(
    out: &Path,
    title: &str,
    series: &[(S, Vec<f64>)],
) -> Result<()> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, ms)| {
            let pts = ms
                .iter()
                .enumerate()
                .filter(|(_, y)| y.is_finite() && **y >= 0.0)
                .map(|(i, &y)| (i as f64, y))
                .collect();
            (name.as_ref(), pts)
        })
        .collect();
    let n = lines.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    if n == 0 {
        bail!("no ubatch latency to plot (every series empty)");
    }
    let y1 = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(0.0f64, f64::max);
    let y1 = if y1 > 0.0 { y1 * 1.12 } else { 1.0 };
    let x1 = (n - 1).max(1) as f64;
    render(out, SIZE, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d(-x1 * 0.02..x1 * 1.02, 0.0..y1)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("ubatch (in replay order)")
            .y_desc("PLE gather latency per ubatch (ms)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| trim_float(*v))
            .axis_desc_style((FONT, 18))
            .label_style((FONT, 15))
            .draw()
            .map_err(draw_err)?;
        draw_lines(&mut chart, &lines, (n <= MARKED_UBATCHES).then_some(3))?;
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// Ubatch charts with at most this many ubatches mark each one.
const MARKED_UBATCHES: usize = 64;

/// Colour of a resident fraction: white (cold) to dark blue (resident), on
/// a square-root scale so that a few percent (page-cache creep) shows.
fn heat(f: f32) -> RGBColor {
    if f.is_nan() {
        // Not asked (a sampled scan with more buckets than samples): grey.
        return RGBColor(200, 200, 200);
    }
    let f = f64::from(f.clamp(0.0, 1.0)).sqrt();
    let lerp = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * f).round() as u8;
    RGBColor(lerp(247, 8), lerp(251, 48), lerp(255, 107))
}

/// Page-cache residency along a table: one cell per bucket (a slice of the
/// table's pages, in file order), shaded from white (none resident) to
/// dark blue (all resident) on a square-root scale, with the colour scale
/// beneath.
///
/// `buckets` holds each bucket's resident fraction (0..=1; NaN, drawn
/// grey, for a bucket no page of which was asked).
pub fn heat_strip(out: &Path, title: &str, buckets: &[f32]) -> Result<()> {
    if buckets.is_empty() {
        bail!("no buckets to plot (empty table)");
    }
    let n = buckets.len() as f64;
    render(out, STRIP_SIZE, |root| {
        let (top, bottom) = root.split_vertically(STRIP_SIZE.1 - 64);
        let mut chart = ChartBuilder::on(&top)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(16)
            .build_cartesian_2d(0.0..100.0, 0.0..1.0)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .disable_x_mesh()
            .x_desc("position in the table (% of its bytes, file order)")
            .x_label_formatter(&|v| format!("{v:.0}%"))
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .draw()
            .map_err(draw_err)?;
        chart
            .draw_series(buckets.iter().enumerate().map(|(i, &f)| {
                let x = |k: f64| k * 100.0 / n;
                Rectangle::new(
                    [(x(i as f64), 0.0), (x(i as f64 + 1.0), 1.0)],
                    heat(f).filled(),
                )
            }))
            .map_err(draw_err)?;
        chart
            .plotting_area()
            .draw(&Rectangle::new([(0.0, 0.0), (100.0, 1.0)], BLACK.mix(0.5)))
            .map_err(draw_err)?;
        scale_bar(&bottom)
    })
}

/// The heat strip's colour scale: `0% resident` to `100% resident`.
fn scale_bar(area: &DrawingArea<SVGBackend, Shift>) -> Result<()> {
    const STEPS: i32 = 20;
    let (w, _) = area.dim_in_pixel();
    let (w, bar, x0, y0) = (w as i32, 240, 0, 18);
    let x0 = x0 + (w - bar) / 2;
    let text = (FONT, 14).into_font().color(&BLACK);
    let right = text.pos(Pos::new(HPos::Right, VPos::Top));
    area.draw(&Text::new("cold (0% resident)", (x0 - 10, y0 + 2), right))
        .map_err(draw_err)?;
    for k in 0..STEPS {
        let (a, b) = (x0 + k * bar / STEPS, x0 + (k + 1) * bar / STEPS);
        // From exactly 0 (white) to exactly 1.
        let f = k as f32 / (STEPS - 1) as f32;
        area.draw(&Rectangle::new([(a, y0), (b, y0 + 16)], heat(f).filled()))
            .map_err(draw_err)?;
    }
    area.draw(&Rectangle::new(
        [(x0, y0), (x0 + bar, y0 + 16)],
        BLACK.mix(0.5),
    ))
    .map_err(draw_err)?;
    area.draw(&Text::new("100% resident", (x0 + bar + 10, y0 + 2), text))
        .map_err(draw_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_has_its_own_colour_and_the_limit_label_its_depths() {
        // Every strategy and the warm charts' `limit-warm` series.
        let n = pleio::Strategy::ALL.len() + 1;
        let colours: std::collections::HashSet<(u8, u8, u8)> =
            (0..n).map(color).map(|c| (c.0, c.1, c.2)).collect();
        assert_eq!(colours.len(), n, "two strategies share a colour");
        let qd = pleio_lab::floor::QUEUE_DEPTHS;
        let depths = format!("{}-{}", qd[0], qd[qd.len() - 1]);
        assert!(LIMIT_LABEL.contains(&depths), "{LIMIT_LABEL}");
    }

    fn count(svg: &str, tag: &str) -> usize {
        svg.matches(tag).count()
    }

    /// Where the charts go: `PLEIO_TEST_PLOT_DIR` if set (to look at them),
    /// else a temporary directory.
    fn out_dir() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
        match std::env::var_os("PLEIO_TEST_PLOT_DIR") {
            Some(d) => (None, d.into()),
            None => {
                let t = tempfile::tempdir().unwrap();
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        }
    }

    /// Bench-like figures: fault slow and linear, uring near the limit.
    fn bench_series() -> Vec<(&'static str, Vec<(u64, f64)>)> {
        let rows = [16u64, 1792, 8192];
        let line = |base: f64, per_row: f64| {
            rows.iter()
                .map(|&r| (r, base + per_row * r as f64))
                .collect::<Vec<_>>()
        };
        vec![
            ("fault", line(900.0, 62.0)),
            ("advise", line(1200.0, 20.0)),
            ("uring", line(300.0, 11.5)),
            ("auto", line(280.0, 11.8)),
        ]
    }

    #[test]
    fn latency_chart_has_every_series_axis_label_and_point() {
        let (_t, dir) = out_dir();
        let out = dir.join("latency.svg");
        let series = bench_series();
        let limit: Vec<(u64, f64)> = [16u64, 1792, 8192]
            .iter()
            .map(|&r| (r, 180.0 + 10.5 * r as f64))
            .collect();
        latency_chart(&out, "cold gather latency", &series, Some(&limit)).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for text in [
            "cold gather latency",
            "rows per batch (log scale)",
            "latency per batch (log scale)",
            LIMIT_LABEL,
            "fault",
            "advise",
            "uring",
            "auto",
            "\n100 ms\n",
        ] {
            assert!(svg.contains(text), "{text:?} missing");
        }
        // Per strategy, in its colour: a line and a legend sample, and
        // three point markers.
        for (i, (name, _)) in series.iter().enumerate() {
            let c = color(i);
            let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            assert_eq!(lines_with(&svg, "<polyline", &stroke), 2, "{name}");
            assert_eq!(lines_with(&svg, "<circle", &fill), 3, "{name}");
        }
        assert_eq!(count(&svg, "<circle"), 3 * series.len());
        // The limit: dashes (several short black lines) and its sample.
        let dashes = lines_with(&svg, "<polyline", "stroke=\"#000000\" stroke-width=\"2\"");
        assert!(dashes > 10, "{dashes} dashed pieces");
        // Ticks at the batch sizes measured, labelled exactly.
        for tick in ["16", "1792", "8192"] {
            assert!(svg.contains(&format!("\n{tick}\n</text>")), "tick {tick}");
        }
        // No temporary file is left beside the chart.
        let temps = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".pleio-tmp")
            })
            .count();
        assert_eq!(temps, 0);
    }

    /// Lines of `svg` holding both `tag` and `attr`.
    fn lines_with(svg: &str, tag: &str, attr: &str) -> usize {
        svg.lines()
            .filter(|l| l.contains(tag) && l.contains(attr))
            .count()
    }

    #[test]
    fn log_ticks_always_show_a_few() {
        assert_eq!(
            log_ticks(750.0..3040.0),
            vec![800.0, 900.0, 1000.0, 1500.0, 2000.0, 3000.0]
        );
        assert_eq!(log_ticks(150.0..2100.0), vec![200.0, 500.0, 1000.0, 2000.0]);
        assert_eq!(log_ticks(3.0..2e7).len(), 7);
        assert_eq!(
            batch_ticks([16.0, 8192.0, 16.0, 1792.0].into_iter()),
            vec![16.0, 1792.0, 8192.0]
        );
        assert_eq!(batch_ticks((1..100).map(f64::from)).len(), MAX_TICKS);
    }

    #[test]
    fn latency_chart_rejects_nothing_to_plot() {
        let (_t, dir) = out_dir();
        let out = dir.join("empty.svg");
        let none: [(&str, Vec<(u64, f64)>); 1] = [("fault", vec![(0, 5.0), (16, f64::NAN)])];
        assert!(latency_chart(&out, "t", &none, None).is_err());
        assert!(!out.exists());
    }

    #[test]
    fn ubatch_chart_has_a_line_per_strategy() {
        let (_t, dir) = out_dir();
        let out = dir.join("ubatch.svg");
        // A cold replay: the first ubatches pay for misses, later ones reuse.
        let curve = |scale: f64| -> Vec<f64> {
            (0..24)
                .map(|i| scale * (4.0 + 40.0 / (1.0 + i as f64)))
                .collect()
        };
        let series = [
            ("fault", curve(6.0)),
            ("uring", curve(1.3)),
            ("auto", curve(1.2)),
        ];
        ubatch_chart(&out, "replay prefill, cold", &series).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for text in [
            "replay prefill, cold",
            "ubatch (in replay order)",
            "PLE gather latency per ubatch (ms)",
            "fault",
            "uring",
            "auto",
        ] {
            assert!(svg.contains(text), "{text:?} missing");
        }
        for (i, (name, _)) in series.iter().enumerate() {
            let c = color(i);
            let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            assert_eq!(lines_with(&svg, "<polyline", &stroke), 2, "{name}");
        }
        assert_eq!(count(&svg, "<circle"), 24 * series.len());
    }

    #[test]
    fn heat_strip_has_one_cell_per_bucket() {
        let (_t, dir) = out_dir();
        let out = dir.join("heat.svg");
        // Resident head, a cold middle, a partly resident tail.
        let buckets: Vec<f32> = (0..64)
            .map(|i| match i {
                0..16 => 1.0,
                16..40 => 0.0,
                _ => (i - 40) as f32 / 24.0,
            })
            .collect();
        heat_strip(&out, "page-cache residency: 44.5%", &buckets).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for text in [
            "page-cache residency: 44.5%",
            "position in the table (% of its bytes, file order)",
            "cold (0% resident)",
            "100% resident",
        ] {
            assert!(svg.contains(text), "{text:?} missing");
        }
        let full = format!("fill=\"#{:02X}{:02X}{:02X}\"", 8, 48, 107);
        let empty = format!("fill=\"#{:02X}{:02X}{:02X}\"", 247, 251, 255);
        // 16 full cells (the tail's last, i = 63, is 23/24: not full) and
        // 24 + 1 (i = 40) empty ones, plus one of each ending the scale.
        assert_eq!(count(&svg, &full), 16 + 1, "{full}");
        assert_eq!(count(&svg, &empty), 25 + 1, "{empty}");
        assert!(heat_strip(&out, "t", &[]).is_err());
    }

    #[test]
    fn labels_are_short_and_exact() {
        assert_eq!(us_label(4.9), "4.9 µs");
        assert_eq!(us_label(250.0), "250 µs");
        assert_eq!(us_label(12_500.0), "12.5 ms");
        assert_eq!(us_label(3e6), "3 s");
    }
}
