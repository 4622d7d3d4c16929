//! The straggler experiment's figures, PNG and SVG (plotters): bars of one value per scheme, and
//! loss against wall time per scheme.
//!
//! Text needs a TrueType font, read at run time: `$PEREGRINE_FONT`, else DejaVu Sans from
//! Debian's `fonts-dejavu-core` (the scripts install it). Without one, plots are an error that
//! says so; the tables are written before.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::AppError;
use crate::output::AtomicFile;

/// Where fonts are looked for, in order.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the font once; the error says how to get one.
fn font() -> Result<(), AppError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let candidates: Vec<PathBuf> =
            std::env::var_os("PEREGRINE_FONT").map(PathBuf::from).into_iter().chain(FONTS.iter().map(PathBuf::from)).collect();
        let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
            "plots need a TrueType font: `apt-get install fonts-dejavu-core`, or set PEREGRINE_FONT to a .ttf file"
                .to_string()
        })?;
        let bytes = std::fs::read(path).map_err(|e| format!("reading font {}: {e}", path.display()))?;
        // The font lives as long as the process: plotters keeps a 'static reference to it.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("font {}: not a TrueType/OpenType font", path.display()))
    })
    .clone()
    .map_err(AppError::Train)
}

fn plot_err(stem: &Path, ext: &str, e: impl std::fmt::Display) -> AppError {
    AppError::Train(format!("plotting {}.{ext}: {e}", stem.display()))
}

/// One curve of a line plot.
pub struct Series {
    /// Legend.
    pub name: String,
    /// `(x, y)` points.
    pub points: Vec<(f64, f64)>,
}

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// `<stem>.png` and `<stem>.svg` (appended, not `with_extension`: a stem may contain dots).
pub fn files(stem: &Path) -> [PathBuf; 2] {
    ["png", "svg"].map(|ext| PathBuf::from(format!("{}.{ext}", stem.display())))
}

/// Draws with `f` into `<stem>.png` and `<stem>.svg`, 960 x 540; each drawn into a temporary
/// file then renamed into place (see [`AtomicFile`]). Both targets are checked (and their
/// temporary files made) before either is drawn, so that a refused SVG leaves no new PNG.
fn both(
    stem: &Path,
    f: impl Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> Drawn,
    g: impl Fn(DrawingArea<SVGBackend<'_>, Shift>) -> Drawn,
) -> Result<(), AppError> {
    font()?;
    let size = (960, 540);
    let [png, svg] = files(stem);
    let (png, svg) = (AtomicFile::create(&png)?, AtomicFile::create(&svg)?);
    f(BitMapBackend::new(png.temp_path(), size).into_drawing_area()).map_err(|e| plot_err(stem, "png", e))?;
    g(SVGBackend::new(svg.temp_path(), size).into_drawing_area()).map_err(|e| plot_err(stem, "svg", e))?;
    png.commit()?;
    svg.commit()
}

/// Writes `<stem>.png` and `<stem>.svg`: one bar per `(label, value)`.
pub fn bars(stem: &Path, title: &str, y_label: &str, bars: &[(String, f64)]) -> Result<(), AppError> {
    both(stem, |root| draw_bars(root, title, y_label, bars), |root| draw_bars(root, title, y_label, bars))
}

fn draw_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let top = bars.iter().map(|b| b.1).filter(|v| v.is_finite()).fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d((0..bars.len()).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.0.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
        let mut r = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), if v.is_finite() { *v } else { 0.0 }),
            ],
            Palette99::pick(i).mix(0.85).filled(),
        );
        r.set_margin(0, 0, 8, 8);
        r
    }))?;
    chart.draw_series(
        bars.iter()
            .enumerate()
            .map(|(i, (_, v))| Text::new(short(*v), (SegmentValue::CenterOf(i), *v), ("sans-serif", 12))),
    )?;
    root.present()?;
    Ok(())
}

/// Three significant digits.
fn short(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}

/// Writes `<stem>.png` and `<stem>.svg`: one line per series.
pub fn lines(
    stem: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), AppError> {
    both(
        stem,
        |root| draw_lines(root, title, x_label, y_label, series),
        |root| draw_lines(root, title, x_label, y_label, series),
    )
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Drawn
where
    DB::ErrorType: 'static,
{
    let pts = || {
        series.iter().flat_map(|s| s.points.iter().copied()).filter(|p| p.0.is_finite() && p.1.is_finite())
    };
    let x_max = pts().map(|p| p.0).fold(0.0f64, f64::max).max(1e-9) * 1.02;
    let (lo, hi) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if lo.is_finite() { (lo, hi.max(lo + 1e-9)) } else { (0.0, 1.0) };
    let pad = (hi - lo) * 0.05;
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad))?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).label_style(("sans-serif", 13)).draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}

/// One rank's phases per iteration (bins of iterations): `(first iteration, compute, comm,
/// wait)` seconds, the mean over the bin.
pub struct RankPhases {
    /// The rank, and whether the straggler report flagged it.
    pub rank: usize,
    pub flagged: bool,
    pub bins: Vec<(f64, f64, f64, f64)>,
}

/// Writes `<stem>.png` and `<stem>.svg`: one panel per rank, its compute, communication and
/// waiting seconds per iteration stacked.
pub fn rank_phases(stem: &Path, title: &str, ranks: &[RankPhases]) -> Result<(), AppError> {
    both(stem, |root| draw_phases(root, title, ranks), |root| draw_phases(root, title, ranks))
}

fn draw_phases<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, ranks: &[RankPhases]) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let top = ranks
        .iter()
        .flat_map(|r| r.bins.iter().map(|b| b.1 + b.2 + b.3))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let last = ranks.iter().flat_map(|r| r.bins.last().map(|b| b.0)).fold(1.0f64, f64::max);
    let colors = [RGBColor(66, 133, 244), RGBColor(251, 188, 5), RGBColor(219, 68, 55)];
    for (area, r) in root.split_evenly((ranks.len().max(1), 1)).into_iter().zip(ranks) {
        let label = format!("rank {}{}", r.rank, if r.flagged { " (straggler)" } else { "" });
        let mut chart = ChartBuilder::on(&area)
            .margin(4)
            .x_label_area_size(18)
            .y_label_area_size(60)
            .caption(label, ("sans-serif", 13))
            .build_cartesian_2d(0.0..last, 0.0..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_labels(3)
            .x_labels(8)
            .label_style(("sans-serif", 11))
            .y_label_formatter(&|v| format!("{:.1} ms", v * 1e3))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        // Stacked: compute, then communication on it, then waiting on both.
        let layers = [
            ("compute", r.bins.iter().map(|b| (b.0, b.1)).collect::<Vec<_>>()),
            ("comm", r.bins.iter().map(|b| (b.0, b.1 + b.2)).collect()),
            ("wait", r.bins.iter().map(|b| (b.0, b.1 + b.2 + b.3)).collect()),
        ];
        for (i, (name, pts)) in layers.iter().enumerate().rev() {
            let c = colors[i];
            chart
                .draw_series(AreaSeries::new(pts.iter().copied(), 0.0, c.mix(0.8)).border_style(c))?
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 11))
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Writes `<stem>.png` and `<stem>.svg`: an `n x n` matrix, `cells` as `(row, column, value)`,
/// darker for more, each cell labelled.
pub fn matrix(
    stem: &Path,
    title: &str,
    labels: (&str, &str),
    n: usize,
    cells: &[(usize, usize, f64)],
) -> Result<(), AppError> {
    both(
        stem,
        |root| draw_matrix(root, title, labels, n, cells),
        |root| draw_matrix(root, title, labels, n, cells),
    )
}

fn draw_matrix<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    (rows, cols): (&str, &str),
    n: usize,
    cells: &[(usize, usize, f64)],
) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let top = cells.iter().map(|c| c.2).fold(0.0f64, f64::max).max(1e-9);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(60)
        // A segmented range covers its end too: 0..n-1 is n cells.
        .build_cartesian_2d((0..n.max(1) - 1).into_segmented(), (0..n.max(1) - 1).into_segmented())?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) => i.to_string(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(cols)
        .y_desc(rows)
        .x_labels(n.min(32))
        .y_labels(n.min(32))
        .x_label_formatter(&label)
        .y_label_formatter(&label)
        .label_style(("sans-serif", 12))
        .draw()?;
    chart.draw_series(cells.iter().map(|&(r, c, v)| {
        let shade = (v / top).clamp(0.0, 1.0);
        Rectangle::new(
            [
                (SegmentValue::Exact(c), SegmentValue::Exact(r)),
                (SegmentValue::Exact(c + 1), SegmentValue::Exact(r + 1)),
            ],
            RGBColor(219, 68, 55).mix(0.1 + 0.9 * shade).filled(),
        )
    }))?;
    if n <= 16 {
        chart.draw_series(cells.iter().map(|&(r, c, v)| {
            Text::new(
                format!("{v:.0}"),
                (SegmentValue::CenterOf(c), SegmentValue::CenterOf(r)),
                ("sans-serif", 14),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

/// One workload on a roofline: its label, arithmetic intensity (FLOP per byte moved) and achieved
/// GFLOP/s.
#[derive(Clone, Debug, PartialEq)]
pub struct RoofPoint {
    pub label: String,
    pub intensity: f64,
    pub gflops: f64,
}

/// Writes `<stem>.png` and `<stem>.svg`: the roofline of a machine whose FMA peak is `peak`
/// GFLOP/s and whose memory bandwidth is `bandwidth` GB/s (`min(peak, bandwidth x intensity)`),
/// on logarithmic axes, with each point labelled (the title names the peak and the bandwidth).
pub fn roofline(
    stem: &Path,
    title: &str,
    peak: f64,
    bandwidth: f64,
    points: &[RoofPoint],
) -> Result<(), AppError> {
    both(
        stem,
        |root| draw_roofline(root, title, peak, bandwidth, points),
        |root| draw_roofline(root, title, peak, bandwidth, points),
    )
}

fn draw_roofline<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    peak: f64,
    bandwidth: f64,
    points: &[RoofPoint],
) -> Drawn
where
    DB::ErrorType: 'static,
{
    let ridge = peak / bandwidth;
    // Whole decades around the ridge and every point.
    let decade = |v: f64, up: bool| 10f64.powf(if up { v.log10().ceil() } else { v.log10().floor() });
    let xs = points.iter().map(|p| p.intensity).chain([ridge]);
    let x_lo = decade(xs.clone().fold(f64::INFINITY, f64::min) / 2.0, false);
    let x_hi = decade(xs.fold(0.0, f64::max) * 2.0, true);
    let y_lo = decade(
        points.iter().map(|p| p.gflops).chain([bandwidth * x_lo]).fold(f64::INFINITY, f64::min) / 2.0,
        false,
    );
    let y_hi = decade(peak * 2.0, true);
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("arithmetic intensity (FLOP per byte moved)")
        .y_desc("GFLOP/s")
        .label_style(("sans-serif", 13))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    let roof = RGBColor(60, 60, 60);
    let line = [(x_lo, bandwidth * x_lo), (ridge, peak), (x_hi, peak)];
    chart.draw_series(LineSeries::new(line, roof.stroke_width(3)))?;
    // The slope's bandwidth is in the title: a label beside it would sit among the points of
    // memory-bound workloads.
    chart.draw_series([Text::new(
        format!("FMA peak {peak:.1} GFLOP/s"),
        (ridge * 1.1, peak * 1.6),
        ("sans-serif", 14),
    )])?;
    // A label's height in decades of the y axis: labels of points close together (the MLP at
    // two batch sizes) go one under the other instead of over each other.
    let height = chart.plotting_area().dim_in_pixel().1.max(1) as f64;
    let line = 16.0 * (y_hi / y_lo).log10() / height;
    let at: Vec<(f64, f64)> = points.iter().map(|p| (p.intensity * 1.12, p.gflops * 0.97)).collect();
    for (i, (p, y)) in points.iter().zip(stack_labels(&at, line)).enumerate() {
        let color = Palette99::pick(i);
        let bound = peak.min(bandwidth * p.intensity);
        chart.draw_series([Circle::new((p.intensity, p.gflops), 6, color.filled())])?;
        chart.draw_series([Text::new(
            format!("{} ({:.0} % of roof)", p.label, 100.0 * p.gflops / bound),
            (p.intensity * 1.12, y),
            ("sans-serif", 13),
        )])?;
    }
    root.present()?;
    Ok(())
}

/// The heights of labels wanted at `at` (x, y on logarithmic axes), each moved down by whole
/// label heights (`line`, in decades) until it is clear of the labels placed before it (within
/// 0.6 decades across and a label's height up or down).
fn stack_labels(at: &[(f64, f64)], line: f64) -> Vec<f64> {
    let mut placed: Vec<(f64, f64)> = Vec::with_capacity(at.len());
    for &(x, y) in at {
        let (x, mut y) = (x.log10(), y.log10());
        while placed.iter().any(|&(px, py)| (px - x).abs() < 0.6 && (py - y).abs() < line) {
            y -= line;
        }
        placed.push((x, y));
    }
    placed.into_iter().map(|(_, y)| 10f64.powf(y)).collect()
}

/// A logarithmic axis's tick: whole numbers from 1, else up to six decimals without trailing zeros.
fn tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{}", (v * 1e6).round() / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::stack_labels;

    #[test]
    fn labels_of_points_close_together_stack_and_others_stay() {
        // Two MLP points at the same intensity and nearly the same height, a third far to the
        // left at the same height, a fourth under the first two but clear of them.
        let at = [(130.0, 390.0), (130.0, 362.0), (0.6, 380.0), (130.0, 100.0)];
        let y = stack_labels(&at, 0.05);
        let log = |v: f64| v.log10();
        assert!((y[0] - 390.0).abs() < 1e-9, "{y:?}");
        assert!((log(y[0]) - log(y[1])).abs() >= 0.05 - 1e-12, "{y:?}");
        assert!(y[1] < 362.0, "{y:?}");
        assert!((y[2] - 380.0).abs() < 1e-9 && (y[3] - 100.0).abs() < 1e-9, "{y:?}");
    }
}
