//! The pingpong bench's chart (`--chart FILE`): one SVG with two panels, round
//! trips per second and CPU time per round trip, a group of bars per (P, T) and
//! a bar per implementation in each group. Drawn with plotters' SVG backend.
//!
//! Included by `benches/pingpong.rs` only (`#[path = "common/chart.rs"]`).

use plotters::prelude::*;
use std::path::Path;

/// One (P, T) configuration: its label and, per series, the medians measured
/// (round trips per second, CPU microseconds per round trip), if it ran.
pub struct Group {
    pub label: String,
    pub values: Vec<Option<(f64, f64)>>,
}

/// The colour of the `k`th series: pollshot first, in the strongest.
fn colour(k: usize) -> RGBColor {
    const COLOURS: [RGBColor; 6] = [
        RGBColor(0x1f, 0x6f, 0xb4), // pollshot
        RGBColor(0x8c, 0x8c, 0x8c), // the hand-written loop
        RGBColor(0xe0, 0x7b, 0x1a), // mio
        RGBColor(0x2c, 0x9a, 0x4a), // polling
        RGBColor(0x9b, 0x4d, 0xca),
        RGBColor(0xc4, 0x3c, 0x3c),
    ];
    COLOURS[k % COLOURS.len()]
}

/// Writes the chart of `groups` (bars named by `series`) to `path`. `title` is
/// the top line, with the legend at its right; `notes` are printed under the
/// panels (the command, the machine).
pub fn write(
    path: &Path,
    title: &str,
    notes: &[String],
    series: &[&str],
    groups: &[Group],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let (top, bottom) = root.split_vertically(36);
    top.draw(&Text::new(
        title.to_string(),
        (12, 10),
        ("sans-serif", 18).into_font().style(FontStyle::Bold),
    ))
    .map_err(|e| draw(&e))?;
    // The legend, once, at the title's right: a square and a name per series.
    let mut x = 1000 - 12 - series.iter().map(|n| 24 + 7 * n.len() as i32).sum::<i32>();
    for (k, name) in series.iter().enumerate() {
        top.draw(&Rectangle::new([(x, 12), (x + 12, 24)], colour(k).filled()))
            .map_err(|e| draw(&e))?;
        top.draw(&Text::new(
            name.to_string(),
            (x + 16, 12),
            ("sans-serif", 13),
        ))
        .map_err(|e| draw(&e))?;
        x += 24 + 7 * name.len() as i32;
    }
    let note_height = 20 * notes.len() as u32 + 8;
    let height = bottom.dim_in_pixel().1;
    let (panels, footer) = bottom.split_vertically(height - note_height);
    for (i, note) in notes.iter().enumerate() {
        footer
            .draw(&Text::new(
                note.clone(),
                (12, 4 + 20 * i as i32),
                ("sans-serif", 13)
                    .into_font()
                    .color(&RGBColor(0x40, 0x40, 0x40)),
            ))
            .map_err(|e| draw(&e))?;
    }
    let (upper, lower) = panels.split_vertically(panels.dim_in_pixel().1 / 2);
    panel(
        &upper,
        "round trips per second (median; higher is better)",
        series,
        groups,
        |(rate, _)| rate,
        |v| format!("{:.0}k", v / 1000.0),
    )
    .map_err(|e| draw(&e))?;
    panel(
        &lower,
        "CPU time per round trip, µs (median, getrusage; lower is better)",
        series,
        groups,
        |(_, cpu)| cpu,
        |v| format!("{v:.1}"),
    )
    .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))
}

/// One panel: a group of bars per configuration, `pick` choosing the value.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    series: &[&str],
    groups: &[Group],
    pick: impl Fn((f64, f64)) -> f64,
    y_label: impl Fn(&f64) -> String,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten().map(|&v| pick(v)))
        .fold(0.0, f64::max);
    let n = groups.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..max * 1.12 + f64::MIN_POSITIVE)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| {
            let g = x.round();
            match groups.get(g as usize) {
                Some(group) if (x - g).abs() < 1e-6 && g >= 0.0 => group.label.clone(),
                _ => String::new(),
            }
        })
        .y_labels(6)
        .y_label_formatter(&y_label)
        .label_style(("sans-serif", 12))
        .draw()?;
    let width = 0.8 / series.len().max(1) as f64;
    for k in 0..series.len() {
        let style = colour(k).filled();
        let bars = groups.iter().enumerate().filter_map(|(g, group)| {
            let value = pick(group.values.get(k).copied().flatten()?);
            let x0 = g as f64 - 0.4 + k as f64 * width;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + width * 0.9, value)],
                style,
            ))
        });
        chart.draw_series(bars)?;
    }
    Ok(())
}
