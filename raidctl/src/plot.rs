//! The benchmark's pictures, drawn with `plotters` as SVG: IOPS against
//! p99 latency per target (both axes logarithmic: the targets differ by
//! orders of magnitude), and throughput per profile for the array, its NBD
//! export and one member (log axis for the same reason). Ticks, units and
//! a legend on each, so a reader needs nothing else.

use crate::bench::{Row, SweepPoint};
use plotters::prelude::*;

/// Colours per target, the same in every picture.
fn colour(target: &str) -> RGBColor {
    match target {
        "array" => RGBColor(31, 119, 180),
        "array-nbd" => RGBColor(214, 39, 40),
        "array-shards" => RGBColor(148, 103, 189),
        "member" => RGBColor(44, 160, 44),
        _ => RGBColor(148, 103, 189),
    }
}

fn targets<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.iter().any(|x| x == n) {
            out.push(n.to_string());
        }
    }
    out
}

/// Powers of ten around `lo..hi`, for a log axis that starts and ends on
/// a decade.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.max(1e-9).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    (lo, hi)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing the plot: {e}")
}

/// IOPS (x) against p99 latency (y) of the queue-depth sweep, one line per
/// target with each point labelled by its queue depth.
pub fn latency_svg(sweep: &[SweepPoint]) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (x0, x1) = decades(
            sweep.iter().map(|s| s.iops).fold(f64::MAX, f64::min),
            sweep.iter().map(|s| s.iops).fold(1.0, f64::max),
        );
        let (y0, y1) = decades(
            sweep
                .iter()
                .map(|s| s.p99_us)
                .fold(f64::MAX, f64::min)
                .max(1.0),
            sweep.iter().map(|s| s.p99_us).fold(1.0, f64::max),
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "4 KiB random read: IOPS against p99 latency (points labelled with queue depth)",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("IOPS (log scale)")
            .y_desc("p99 latency, µs (log scale)")
            .x_label_formatter(&|v| human(*v))
            .y_label_formatter(&|v| human(*v))
            .draw()
            .map_err(err)?;
        for t in targets(sweep.iter().map(|s| s.target.as_str())) {
            let c = colour(&t);
            let pts: Vec<(f64, f64)> = sweep
                .iter()
                .filter(|s| s.target == t)
                .map(|s| (s.iops.max(x0), s.p99_us.max(y0)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(t.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(err)?;
            chart
                .draw_series(sweep.iter().filter(|s| s.target == t).map(|s| {
                    Text::new(
                        format!("{}", s.qd),
                        (s.iops.max(x0), s.p99_us.max(y0)),
                        ("sans-serif", 11).into_font().color(&c),
                    )
                }))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Throughput (GB/s, log axis) of each profile and data kind, a bar per
/// target side by side.
pub fn throughput_svg(rows: &[Row]) -> Result<String, String> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in rows {
        let g = (r.profile.clone(), r.data.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let names = targets(rows.iter().map(|r| r.target.as_str()));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (y0, _) = decades(
            rows.iter()
                .map(|r| r.gb_per_s)
                .filter(|v| *v > 0.0)
                .fold(f64::MAX, f64::min),
            1.0,
        );
        // Just below the decade, so its tick is drawn and labelled.
        let y0 = y0 * 0.9;
        // Headroom above the tallest bar for the legend, not a whole decade.
        let y1 = rows.iter().map(|r| r.gb_per_s).fold(0.01, f64::max) * 3.0;
        let n = groups.len() as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Throughput per fio profile (z72: data 72% zeros, else random)",
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(60)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n, (y0..y1).log_scale())
            .map_err(err)?;
        let labels: Vec<String> = groups
            .iter()
            .map(|(p, d)| {
                let z = if d.starts_with("compressible") {
                    " z72"
                } else {
                    ""
                };
                format!("{p}{z}")
            })
            .collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = (*x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 11))
            .y_desc("GB/s (log scale)")
            .y_labels(12)
            .y_label_formatter(&|v| {
                if *v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v}")
                }
            })
            .draw()
            .map_err(err)?;
        let w = 0.8 / names.len().max(1) as f64;
        for (k, t) in names.iter().enumerate() {
            let c = colour(t);
            let bars: Vec<Rectangle<(f64, f64)>> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, (p, d))| {
                    let r = rows
                        .iter()
                        .find(|r| &r.profile == p && &r.data == d && &r.target == t)?;
                    let x = i as f64 + 0.1 + k as f64 * w;
                    Some(Rectangle::new(
                        [(x, y0), (x + w * 0.95, r.gb_per_s.max(y0))],
                        c.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(t.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// 1500 -> "1.5k", 2000000 -> "2M".
fn human(v: f64) -> String {
    let (d, s) = if v >= 1e6 {
        (1e6, "M")
    } else if v >= 1e3 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let x = v / d;
    if x.fract().abs() < 1e-9 {
        format!("{x:.0}{s}")
    } else {
        format!("{x:.1}{s}")
    }
}
