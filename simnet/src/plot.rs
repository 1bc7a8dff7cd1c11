//! PNG plots of a comparison (plotters, with an embedded DejaVu Sans font
//! so text renders on any machine).

use std::{path::Path, sync::Once};

use plotters::{
    backend::{BitMapBackend, DrawingBackend},
    drawing::DrawingAreaErrorKind,
    prelude::*,
};

use crate::{compare::Comparison, sim::RunOutput};

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        // Registration only fails on an invalid font file, which this is not.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

/// Why a chart could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// plotters failed to draw or to write the PNG.
    #[error(transparent)]
    Draw(#[from] DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>),
}

/// A named series of (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A line chart; `hline` draws a dashed horizontal reference.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hline: Option<f64>,
) -> Result<(), PlotError> {
    register_font();
    let points = series.iter().flat_map(|(_, p)| p.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if let Some(h) = hline {
        y0 = y0.min(h);
        y1 = y1.max(h);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1.max(x0 + 1e-9), (y0 - pad)..(y1 + pad))?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).label_style(("sans-serif", 15)).draw()?;
    if let Some(h) = hline {
        chart.draw_series(DashedLineSeries::new(vec![(x0, h), (x1, h)], 6, 4, BLACK.stroke_width(1)))?;
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = if name.starts_with("ideal") { BLACK.stroke_width(2) } else { color.stroke_width(2) };
        chart
            .draw_series(LineSeries::new(pts.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()), style))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

/// The first seed's run of each strategy.
fn first_runs(outputs: &[RunOutput]) -> Vec<&RunOutput> {
    let mut seen = Vec::new();
    outputs
        .iter()
        .filter(|o| {
            let new = !seen.contains(&o.strategy);
            seen.push(o.strategy);
            new
        })
        .collect()
}

/// Writes every plot of a comparison into `dir`.
pub fn write_plots(dir: &Path, c: &Comparison, outputs: &[RunOutput]) -> Result<(), PlotError> {
    let runs = first_runs(outputs);
    let name = |o: &RunOutput| o.strategy.name().to_string();

    let mut loss: Vec<Series> =
        runs.iter().map(|o| (name(o), o.series.iter().map(|s| (s.t, s.loss as f64)).collect())).collect();
    if let Some(ddp) = runs.iter().find(|o| o.strategy == ragtag_protocol::engine::Strategy::Ddp) {
        let ideal = ddp.series.iter().map(|s| (s.samples as f64 / c.aggregate_samples_per_s, s.loss as f64)).collect();
        loss.push(("ideal (ddp's samples at the swarm's full compute)".into(), ideal));
    }
    line_chart(
        &dir.join("loss_vs_time.png"),
        &format!("{}: held-out loss of the mean replica", c.scenario),
        "virtual time (s)",
        "held-out loss (nats)",
        &loss,
        Some(c.target_loss as f64),
    )?;

    let util: Vec<Series> = runs
        .iter()
        .map(|o| {
            let mut nodes: Vec<_> = o.nodes.iter().collect();
            nodes.sort_by(|a, b| a.speed.total_cmp(&b.speed).then(a.index.cmp(&b.index)));
            (name(o), nodes.iter().enumerate().map(|(i, n)| (i as f64, 100.0 * n.utilisation())).collect())
        })
        .collect();
    line_chart(
        &dir.join("utilisation.png"),
        "utilisation per node (nodes sorted by speed)",
        "node (slowest to fastest)",
        "busy / up (%)",
        &util,
        Some(100.0),
    )?;

    let stale: Vec<Series> = runs
        .iter()
        .map(|o| {
            let total: u64 = o.tally.staleness_histogram.iter().sum::<u64>().max(1);
            (
                name(o),
                o.tally
                    .staleness_histogram
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (i as f64, *c as f64 / total as f64))
                    .collect(),
            )
        })
        .collect();
    line_chart(
        &dir.join("staleness.png"),
        "staleness of applied updates",
        "staleness tau (7 = 7 or more)",
        "fraction of applied updates",
        &stale,
        None,
    )?;

    let consensus: Vec<Series> = runs
        .iter()
        .map(|o| (name(o), o.series.iter().map(|s| (s.t, (s.consensus_max as f64).max(1e-12).log10())).collect()))
        .collect();
    line_chart(
        &dir.join("consensus.png"),
        "consensus distance (largest replica distance to the mean)",
        "virtual time (s)",
        "log10 relative distance",
        &consensus,
        None,
    )?;

    let bytes: Vec<Series> = runs
        .iter()
        .map(|o| (name(o), o.nodes.iter().map(|n| (n.index as f64, (n.bytes_sent.max(1) as f64).log10())).collect()))
        .collect();
    line_chart(&dir.join("bytes_per_node.png"), "bytes sent per node", "node", "log10 bytes", &bytes, None)?;

    if let Some(o) = runs.iter().find(|o| !o.layers.samples.is_empty()) {
        let layers: Vec<Series> = o
            .layers
            .names()
            .iter()
            .map(|l| {
                (
                    l.clone(),
                    o.layers
                        .samples
                        .iter()
                        .filter(|s| &s.layer == l)
                        .map(|s| (s.t, s.cosine_fast_slow as f64))
                        .collect(),
                )
            })
            .collect();
        line_chart(
            &dir.join("layer_similarity.png"),
            &format!("{}: cosine of fast vs slow nodes' summed updates, per layer", o.strategy.name()),
            "virtual time (s)",
            "cosine similarity",
            &layers,
            Some(0.0),
        )?;
    }
    Ok(())
}
