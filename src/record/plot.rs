//! `pi0d plot`: a recording as one PNG, for people who would rather look than read. Per joint,
//! commanded and measured position and velocity, the joint's limits, the chunk arrivals (ticks
//! along the top), and the spans the arm was holding, e-stopped or stopping, shaded.
//!
//! Whatever the recording holds, the image is bounded (at most `MAX_JOINTS` rows) and every
//! axis finite: values beyond `PLOT_ABS_MAX` (no joint's, in any unit pi0d records) and
//! times outside the run are left out of the lines, and said so.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::read::{PlotLimits, RunTrace, Span, MAX_JOINTS};

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{recording}: drawing the plot")]
    Draw {
        recording: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{path}: cannot write the PNG")]
    Write {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    #[error("{recording}: the recording has no joints to plot")]
    Empty { recording: PathBuf },
    #[error("{recording}: {joints} joints; a plot has at most {MAX_JOINTS}")]
    TooManyJoints { recording: PathBuf, joints: usize },
}

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1600;
const ROW: u32 = 210;
/// Up to three title lines and the legend.
const HEADER: u32 = 126;
/// Title characters per line: DejaVu Sans at 22 px averages under 13 px a character, and the
/// title has the image's width less its 16 px margins.
const TITLE_CHARS: usize = 110;
/// The y of the legend's row.
const LEGEND_Y: i32 = 104;
/// Title lines at most: the name, the policy and the counts (each cut to its cap) fit in three.
const TITLE_LINES: usize = 3;
/// Points drawn per line at most (longer runs are thinned evenly).
const MAX_POINTS: usize = 4000;
/// Values beyond this are left out of lines and axes (see the module's comment).
pub(crate) const PLOT_ABS_MAX: f64 = 1e9;
/// Text from the file (joint names, the policy) is cut to this many characters.
const NAME_CHARS: usize = 48;
const POLICY_CHARS: usize = 96;

const COMMANDED: RGBColor = RGBColor(31, 119, 180);
const MEASURED: RGBColor = RGBColor(255, 127, 14);
const LIMIT: RGBColor = RGBColor(214, 39, 40);
const CHUNK: RGBColor = RGBColor(90, 90, 90);
const HOLD: RGBColor = RGBColor(255, 224, 178);
const ESTOP: RGBColor = RGBColor(255, 195, 195);
const STOPPING: RGBColor = RGBColor(228, 228, 228);

/// Turns a drawing error into `PlotError::Draw`; the recording is named by `plot`.
fn draw<T, E: std::error::Error + Send + Sync + 'static>(r: Result<T, E>) -> Result<T, PlotError> {
    r.map_err(|e| PlotError::Draw {
        recording: PathBuf::new(),
        source: Box::new(e),
    })
}

/// Ticks per axis at most (plotters picks round values, at most this many).
const X_LABELS: usize = 10;
const Y_LABELS: usize = 5;

/// Decimals that tell apart the ticks of an axis over `lo..hi` with at most `labels` ticks:
/// plotters spaces them at least `(hi - lo) / labels` apart, on round steps (1, 2 or 5 times a
/// power of ten), so the decimals of that smallest step are enough.
pub(crate) fn tick_decimals(lo: f64, hi: f64, labels: usize) -> usize {
    let step = (hi - lo).abs() / labels.max(1) as f64;
    if !step.is_finite() || step <= 0.0 {
        return 3;
    }
    // A hair under the power of ten it is: 0.001 needs 3, not 4 for rounding.
    (-(step.log10()) - 1e-9).ceil().clamp(0.0, 12.0) as usize
}

/// The title's parts joined by ", " into lines of at most `max` characters where a part fits
/// (a part longer than a line is a line of its own, shortened).
fn title_lines(parts: &[String], max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for p in parts.iter().filter(|p| !p.is_empty()) {
        let p = shortened(p, max.saturating_sub(2));
        if line.is_empty() {
            line = p;
        } else if line.chars().count() + 2 + p.chars().count() <= max {
            line = format!("{line}, {p}");
        } else {
            lines.push(format!("{line},"));
            line = p;
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A value that can be drawn: finite and within `PLOT_ABS_MAX`.
fn drawable(v: f64) -> bool {
    v.is_finite() && v.abs() <= PLOT_ABS_MAX
}

/// At most `n` characters of `s`, with an ellipsis when cut.
fn shortened(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

fn span_colour(s: &Span) -> RGBColor {
    if s.state.starts_with("estopped") {
        ESTOP
    } else if s.state.starts_with("stopping") {
        STOPPING
    } else {
        HOLD
    }
}

/// `YYYY-mm-dd HH:MM:SS UTC`.
fn utc_text(ns: u64) -> String {
    let stamp = super::utc_stamp(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns));
    // From `YYYYmmddTHHMMSSZ`.
    format!(
        "{}-{}-{} {}:{}:{} UTC",
        &stamp[0..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..15]
    )
}

/// `(min, max)` of the drawable values, padded; a flat line gets a small band, no values
/// `(-1, 1)`. Always finite, with `min < max`.
fn y_range<'a>(values: impl Iterator<Item = &'a f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for &v in values.filter(|v| drawable(**v)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (-1.0, 1.0);
    }
    let pad = ((hi - lo) * 0.08).max(1e-3);
    (lo - pad, hi + pad)
}

/// Widens `(lo, hi)` to take in each limit within one span of the data; the others are
/// named as off the scale.
fn with_limits(range: (f64, f64), limits: &[f64]) -> ((f64, f64), Vec<f64>, Vec<f64>) {
    let (mut lo, mut hi) = range;
    let span = hi - lo;
    let (mut shown, mut off) = (Vec::new(), Vec::new());
    for &l in limits.iter().filter(|l| drawable(**l)) {
        if l >= range.0 - span && l <= range.1 + span {
            lo = lo.min(l - span * 0.05);
            hi = hi.max(l + span * 0.05);
            shown.push(l);
        } else {
            off.push(l);
        }
    }
    ((lo, hi), shown, off)
}

/// At most `MAX_POINTS` of the points, evenly; only those inside `x` (the chart's time axis)
/// with drawable values: a point far outside the chart would map to no pixel.
fn thinned(t: &[f64], v: &[f64], x: (f64, f64)) -> Vec<(f64, f64)> {
    let stride = t.len().div_ceil(MAX_POINTS).max(1);
    t.iter()
        .zip(v)
        .step_by(stride)
        .filter(|(t, y)| drawable(**y) && (x.0..=x.1).contains(*t))
        .map(|(a, b)| (*a, *b))
        .collect()
}

/// Values in `v` that are not drawable (non-finite ones are not counted: a velocity is NaN
/// where none was recorded).
fn off_scale(v: &[f64]) -> usize {
    v.iter()
        .filter(|v| v.is_finite() && v.abs() > PLOT_ABS_MAX)
        .count()
}

/// Draws `trace` into `out` (PNG), titled by the recording's file name.
pub fn plot(trace: &RunTrace, out: &Path) -> Result<(u32, u32), PlotError> {
    plot_inner(trace, out).map_err(|e| match e {
        PlotError::Draw { source, .. } => PlotError::Draw {
            recording: trace.path.clone(),
            source,
        },
        e => e,
    })
}

fn plot_inner(trace: &RunTrace, out: &Path) -> Result<(u32, u32), PlotError> {
    static FONT_ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    FONT_ONCE.get_or_init(|| {
        register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../../assets/fonts/DejaVuSans.ttf"),
        )
        .is_ok()
    });
    let joints = trace.joints.len();
    if joints == 0 {
        return Err(PlotError::Empty {
            recording: trace.path.clone(),
        });
    }
    if joints > MAX_JOINTS {
        return Err(PlotError::TooManyJoints {
            recording: trace.path.clone(),
            joints,
        });
    }
    let name = trace
        .path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    // At most MAX_JOINTS rows: about 33 MB of pixels.
    let height = HEADER + ROW * joints as u32;
    let mut buf = vec![255u8; WIDTH as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, height)).into_drawing_area();
        draw(root.fill(&WHITE))?;
        let (top, body) = root.split_vertically(HEADER);
        let policy = shortened(
            trace
                .metadata
                .get("policy")
                .map(String::as_str)
                .unwrap_or("policy unknown"),
            POLICY_CHARS,
        );
        let holds = trace
            .spans
            .iter()
            .filter(|s| !s.state.starts_with("stopping"))
            .count();
        let title = title_lines(
            &[
                format!("pi0d run {}", shortened(&name, NAME_CHARS)),
                format!("from {}", utc_text(trace.start_ns)),
                format!("{:.1} s", trace.duration_s()),
                format!("{} chunks", trace.chunks),
                format!("{holds} hold(s)"),
                policy,
            ],
            TITLE_CHARS,
        );
        for (k, line) in title.iter().take(TITLE_LINES).enumerate() {
            let y = 8 + 26 * k as i32;
            draw(top.draw_text(line, &(FONT, 22).into_font().color(&BLACK), (16, y)))?;
        }
        if let Some(why) = &trace.partial {
            let note = shortened(&format!("{why}: plotted up to there"), 70);
            draw(top.draw_text(
                &note,
                &(FONT, 14).into_font().color(&LIMIT),
                (900, LEGEND_Y - 7),
            ))?;
        }
        legend(&top)?;
        // Finite: times are u64 nanoseconds from the first command.
        let t_end = trace.duration_s().max(1e-3);
        let cells = body.split_evenly((joints, 2));
        for (i, cell) in cells.iter().enumerate() {
            let (j, velocity) = (i / 2, i % 2 == 1);
            panel(cell, trace, j, velocity, t_end)?;
        }
        draw(root.present())?;
    }
    write_png(out, &buf, WIDTH, height).map_err(|source| PlotError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    Ok((WIDTH, height))
}

/// A few hundred flat colours compress well at the highest level (about a fifth of the
/// default's size).
fn write_png(out: &Path, rgb: &[u8], w: u32, h: u32) -> Result<(), image::ImageError> {
    use image::codecs::png::{CompressionType, FilterType, PngEncoder};
    use image::ImageEncoder;
    let file =
        std::io::BufWriter::new(std::fs::File::create(out).map_err(image::ImageError::IoError)?);
    PngEncoder::new_with_quality(file, CompressionType::Best, FilterType::Adaptive).write_image(
        rgb,
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )
}

fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let items: [(&str, RGBColor, bool); 7] = [
        ("commanded", COMMANDED, false),
        ("measured", MEASURED, false),
        ("limit", LIMIT, false),
        ("chunk arrival", CHUNK, false),
        ("holding", HOLD, true),
        ("e-stopped", ESTOP, true),
        ("stopping", STOPPING, true),
    ];
    let mut x = 16;
    let y = LEGEND_Y;
    for (label, colour, filled) in items {
        if filled {
            draw(area.draw(&Rectangle::new(
                [(x, y - 6), (x + 26, y + 8)],
                colour.filled(),
            )))?;
        } else {
            draw(area.draw(&PathElement::new(
                vec![(x, y + 1), (x + 26, y + 1)],
                colour.stroke_width(3),
            )))?;
        }
        draw(area.draw_text(
            label,
            &(FONT, 15).into_font().color(&BLACK),
            (x + 32, y - 7),
        ))?;
        x += 48 + 9 * label.len() as i32;
    }
    Ok(())
}

fn panel<DB: DrawingBackend>(
    cell: &DrawingArea<DB, plotters::coord::Shift>,
    trace: &RunTrace,
    j: usize,
    velocity: bool,
    t_end: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let (cmd, meas) = if velocity {
        (&trace.command.velocity[j], &trace.measured.velocity[j])
    } else {
        (&trace.command.position[j], &trace.measured.position[j])
    };
    let lim: PlotLimits = trace.limits.get(j).copied().unwrap_or_default();
    let limits: Vec<f64> = if velocity {
        lim.velocity.map(|v| vec![-v, v]).unwrap_or_default()
    } else {
        [lim.lower, lim.upper].into_iter().flatten().collect()
    };
    let ((y0, y1), shown, off) = with_limits(y_range(cmd.iter().chain(meas.iter())), &limits);
    let mut caption = format!(
        "{} {}",
        shortened(&trace.joints[j], NAME_CHARS),
        if velocity {
            "velocity (/s)"
        } else {
            "position"
        }
    );
    if !off.is_empty() {
        let list: Vec<String> = off.iter().map(|l| format!("{l:.2}")).collect();
        caption += &format!("   limits {} off scale", list.join(", "));
    }
    let beyond = off_scale(cmd) + off_scale(meas);
    if beyond > 0 {
        caption += &format!("   {beyond} values beyond ±{PLOT_ABS_MAX:e} left out");
    }
    let x = (0.0, t_end);
    let inside = |t: f64| t.clamp(x.0, x.1);
    // Enough decimals that neighbouring ticks read differently (a gripper moves millimetres).
    let (xd, yd) = (
        tick_decimals(x.0, x.1, X_LABELS),
        tick_decimals(y0, y1, Y_LABELS),
    );
    let mut chart = draw(
        ChartBuilder::on(cell)
            .margin(6)
            .caption(caption, (FONT, 15))
            .x_label_area_size(22)
            .y_label_area_size(62)
            .build_cartesian_2d(0f64..t_end, y0..y1),
    )?;
    draw(
        chart
            .configure_mesh()
            .x_labels(X_LABELS)
            .y_labels(Y_LABELS)
            .label_style((FONT, 12))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(220, 220, 220))
            .x_label_formatter(&|x| format!("{x:.xd$} s"))
            .y_label_formatter(&|y| format!("{y:.yd$}"))
            .draw(),
    )?;
    draw(chart.draw_series(trace.spans.iter().map(|s| {
        Rectangle::new(
            [(inside(s.from_s), y0), (inside(s.to_s.max(s.from_s)), y1)],
            span_colour(s).filled(),
        )
    })))?;
    let tick = (y1 - y0) * 0.07;
    draw(
        chart.draw_series(
            trace
                .chunk_arrivals_s
                .iter()
                .filter(|t| (x.0..=x.1).contains(*t))
                .map(|&t| PathElement::new(vec![(t, y1 - tick), (t, y1)], CHUNK.stroke_width(1))),
        ),
    )?;
    for l in shown {
        draw(chart.draw_series(DashedLineSeries::new(
            vec![(0.0, l), (t_end, l)],
            8,
            5,
            LIMIT.stroke_width(1),
        )))?;
    }
    draw(chart.draw_series(LineSeries::new(
        thinned(&trace.measured.t, meas, x),
        MEASURED.stroke_width(2),
    )))?;
    draw(chart.draw_series(LineSeries::new(
        thinned(&trace.command.t, cmd, x),
        COMMANDED.stroke_width(1),
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_a_limit_is_near_the_data_expect_it_drawn_and_a_far_one_named() {
        let ((lo, hi), shown, off) = with_limits((0.0, 1.0), &[-0.5, 10.0]);
        assert_eq!(shown, [-0.5]);
        assert_eq!(off, [10.0]);
        assert!(lo <= -0.5 && hi == 1.0, "{lo} {hi}");
    }

    #[test]
    fn when_values_reach_1e308_expect_a_finite_y_range() {
        for values in [
            vec![1e308, -1e308, 1e308],
            vec![f64::MAX, f64::MIN, 0.25],
            vec![f64::INFINITY, f64::NAN],
            vec![PLOT_ABS_MAX, -PLOT_ABS_MAX],
        ] {
            let (lo, hi) = y_range(values.iter());
            assert!(
                lo.is_finite() && hi.is_finite() && lo < hi,
                "{values:?}: {lo} {hi}"
            );
            assert!((hi - lo).is_finite(), "{values:?}");
        }
        // The drawable value sets the range; the huge ones are left out and counted.
        let (lo, hi) = y_range([1e308, 0.25, -1e308].iter());
        assert!(lo < 0.25 && hi > 0.25 && hi - lo < 0.01, "{lo} {hi}");
        assert_eq!(off_scale(&[1e308, 0.25, -1e308, f64::NAN]), 2);
        let ((lo, hi), shown, _) = with_limits((0.0, 1.0), &[1e308, f64::INFINITY, 0.5]);
        assert_eq!(shown, [0.5]);
        assert!(lo.is_finite() && hi.is_finite());
    }

    fn trace(joints: usize) -> RunTrace {
        RunTrace {
            path: std::env::temp_dir().join("crafted-run.mcap"),
            joints: (0..joints).map(|j| format!("j{j}")).collect(),
            command: super::super::read::Series {
                t: vec![0.0, 1.0],
                position: vec![vec![0.0, 1.0]; joints],
                velocity: vec![vec![1.0, 1.0]; joints],
            },
            measured: super::super::read::Series {
                t: Vec::new(),
                position: vec![Vec::new(); joints],
                velocity: vec![Vec::new(); joints],
            },
            ..RunTrace::default()
        }
    }

    #[test]
    fn when_a_trace_has_more_joints_than_a_plot_holds_expect_an_error_naming_the_recording() {
        let t = trace(MAX_JOINTS + 1);
        let dir = crate::test_dirs::TempDir::new("plot-many");
        let out = dir.join("many.png");
        let e = plot(&t, &out).unwrap_err();
        assert!(matches!(e, PlotError::TooManyJoints { joints, .. } if joints == MAX_JOINTS + 1));
        assert!(e.to_string().contains("crafted-run.mcap"), "{e}");
        assert!(!out.exists());
    }

    #[test]
    fn when_the_trace_has_no_joints_expect_the_error_to_name_the_recording() {
        let dir = crate::test_dirs::TempDir::new("plot-none");
        let out = dir.join("none.png");
        let e = plot(&trace(0), &out).unwrap_err();
        assert!(matches!(e, PlotError::Empty { .. }), "{e:?}");
        assert!(e.to_string().contains("crafted-run.mcap"), "{e}");
    }

    /// The labels plotters draws for `lo..hi` with at most `n` ticks, at `tick_decimals`.
    fn labels(lo: f64, hi: f64, n: usize) -> Vec<String> {
        use plotters::coord::ranged1d::Ranged;
        let d = tick_decimals(lo, hi, n);
        let axis: plotters::coord::types::RangedCoordf64 = (lo..hi).into();
        axis.key_points(n)
            .iter()
            .map(|v: &f64| format!("{v:.d$}"))
            .collect()
    }

    #[test]
    fn when_an_axis_spans_a_gripper_millimetre_expect_distinct_tick_labels() {
        // The report: a gripper between 0.0203 and 0.0212 m read 0.021, 0.021, 0.020.
        let l = labels(0.0203, 0.0212, Y_LABELS);
        assert!(l.len() >= 2, "{l:?}");
        let mut unique = l.clone();
        unique.dedup();
        assert_eq!(unique, l, "repeated tick labels");
        assert!(l.iter().all(|s| s.len() <= "0.02120".len()), "{l:?}");
    }

    #[test]
    fn when_axes_span_any_scale_expect_distinct_tick_labels_and_no_needless_decimals() {
        for (lo, hi) in [
            (0.0, 1.0),
            (-3.2, 3.2),
            (0.0203, 0.0212),
            (1e-6, 3e-6),
            (-0.5e-3, 0.5e-3),
            (100.0, 100.4),
            (0.0, 12_000.0),
            (0.0, 0.3),
        ] {
            for n in [Y_LABELS, X_LABELS] {
                let l = labels(lo, hi, n);
                let mut unique = l.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), l.len(), "{lo}..{hi}, {n} ticks: {l:?}");
            }
        }
        assert_eq!(tick_decimals(0.0, 12_000.0, 5), 0);
        assert_eq!(
            tick_decimals(-3.2, 3.2, 5),
            0,
            "ticks at least 1.28 apart: whole numbers"
        );
        assert_eq!(tick_decimals(0.0, 1.0, 5), 1);
        assert_eq!(tick_decimals(0.0, 0.005, 5), 3);
        assert_eq!(tick_decimals(1.0, 1.0, 5), 3, "an empty span falls back");
    }

    #[test]
    fn when_the_title_is_longer_than_a_line_expect_it_wrapped_at_parts_within_the_width() {
        let parts: Vec<String> = [
            "pi0d run 20250101T120000Z-a-rather-long-recording-name.mcap",
            "from 2025-01-01 12:00:00 UTC",
            "12.5 s",
            "31 chunks",
            "2 hold(s)",
            "pi0 models/tiny-pi0 (cpu, 8 threads) with a long policy description here",
        ]
        .map(String::from)
        .to_vec();
        let lines = title_lines(&parts, 80);
        assert!(lines.len() >= 2, "{lines:?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 81), "{lines:?}");
        // Nothing lost: every part is on some line, whole.
        for p in &parts {
            assert!(
                lines.iter().any(|l| l.contains(p.as_str())),
                "{p:?} in {lines:?}"
            );
        }
        // The longest parts the plot allows still fit in its lines.
        let longest = [
            format!("pi0d run {}", shortened(&"n".repeat(300), NAME_CHARS)),
            "from 2025-01-01 12:00:00 UTC".into(),
            "86400.0 s".into(),
            "100000 chunks".into(),
            "10000 hold(s)".into(),
            shortened(&"p".repeat(300), POLICY_CHARS),
        ];
        assert!(title_lines(&longest, TITLE_CHARS).len() <= TITLE_LINES);
        // Short enough: one line.
        assert_eq!(
            title_lines(&parts[1..3], 80),
            ["from 2025-01-01 12:00:00 UTC, 12.5 s"]
        );
    }

    #[test]
    fn when_a_run_is_long_expect_lines_thinned_to_the_cap() {
        let t: Vec<f64> = (0..100_000).map(|i| i as f64).collect();
        let pts = thinned(&t, &t, (0.0, 1e6));
        assert!(
            pts.len() <= MAX_POINTS && pts.len() > MAX_POINTS / 2,
            "{}",
            pts.len()
        );
        assert_eq!(pts[0], (0.0, 0.0));
    }
}
