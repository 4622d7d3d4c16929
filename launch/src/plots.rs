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

use crate::world::AppError;

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

fn plot_err(path: &Path, e: impl std::fmt::Display) -> AppError {
    AppError::Train(format!("plotting {}: {e}", path.display()))
}

/// One curve of a line plot.
pub struct Series {
    /// Legend.
    pub name: String,
    /// `(x, y)` points.
    pub points: Vec<(f64, f64)>,
}

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Draws with `f` into `<stem>.png` and `<stem>.svg`, 960 x 540.
fn both(
    stem: &Path,
    f: impl Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> Drawn,
    g: impl Fn(DrawingArea<SVGBackend<'_>, Shift>) -> Drawn,
) -> Result<(), AppError> {
    font()?;
    let size = (960, 540);
    // Appended, not `with_extension`: a stem may contain dots.
    let png = PathBuf::from(format!("{}.png", stem.display()));
    f(BitMapBackend::new(&png, size).into_drawing_area()).map_err(|e| plot_err(&png, e))?;
    let svg = PathBuf::from(format!("{}.svg", stem.display()));
    g(SVGBackend::new(&svg, size).into_drawing_area()).map_err(|e| plot_err(&svg, e))
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
