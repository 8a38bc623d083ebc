//! A small SVG line chart, so the benchmark report can show growth with size.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

fn nice_max(v: f64) -> f64 {
    let mag = 10f64.powf(v.max(1e-9).log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * mag)
}

/// How values map to the plot's axes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Axes {
    /// Both linear, from zero.
    Linear,
    /// Both logarithmic, over whole decades: a cost that grows linearly with
    /// size is a straight line, and a cost per unit that stays put is flat.
    LogLog,
}

/// The ends of an axis holding `values`, and its ticks.
fn axis(values: impl Iterator<Item = f64>, axes: Axes) -> (f64, f64, Vec<f64>) {
    let values: Vec<f64> = values.collect();
    match axes {
        Axes::Linear => {
            let max = nice_max(values.iter().copied().fold(0.0, f64::max));
            (0.0, max, (0..=5).map(|i| max * i as f64 / 5.0).collect())
        }
        Axes::LogLog => {
            let lo = values
                .iter()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(0.0, f64::max);
            let (lo, hi) = if lo.is_finite() {
                (lo, hi)
            } else {
                (1.0, 10.0)
            };
            let (a, b) = (
                lo.log10().floor(),
                hi.log10().ceil().max(lo.log10().floor() + 1.0),
            );
            let ticks = (a as i32..=b as i32).map(|e| 10f64.powi(e)).collect();
            (10f64.powf(a), 10f64.powf(b), ticks)
        }
    }
}

/// A tick's label: no needless decimals.
fn label(v: f64) -> String {
    if v >= 1.0 || v == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.3}").trim_end_matches('0').to_string()
    }
}

/// A line chart of `series` on linear axes starting at zero.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    chart(title, x_label, y_label, series, Axes::Linear)
}

/// A line chart of `series`.
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series], axes: Axes) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 70.0, 250.0, 40.0, 50.0);
    let points = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1, xticks) = axis(points().map(|p| p.0), axes);
    let (y0, y1, yticks) = axis(points().map(|p| p.1), axes);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let scaled = |v: f64, lo: f64, hi: f64| match axes {
        Axes::Linear => (v - lo) / (hi - lo),
        Axes::LogLog => (v.log10() - lo.log10()) / (hi.log10() - lo.log10()),
    };
    let x = |v: f64| left + scaled(v, x0, x1) * pw;
    let y = |v: f64| top + ph - scaled(v, y0, y1) * ph;
    let mut out = String::new();
    writeln!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#).unwrap();
    writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#).unwrap();
    writeln!(
        out,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{title}</text>"#,
        left + pw / 2.0
    )
    .unwrap();
    for fy in yticks {
        writeln!(out, r##"<line x1="{l}" x2="{r}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{tx}" y="{ty}" text-anchor="end">{t}</text>"##, l = left, r = left + pw, yy = y(fy), tx = left - 6.0, ty = y(fy) + 4.0, t = label(fy)).unwrap();
    }
    for fx in xticks {
        writeln!(
            out,
            r##"<text x="{xx}" y="{ty}" text-anchor="middle">{t}</text>"##,
            xx = x(fx),
            ty = top + ph + 18.0,
            t = label(fx)
        )
        .unwrap();
    }
    writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        left + pw / 2.0,
        h - 10.0
    )
    .unwrap();
    writeln!(out, r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{y_label}</text>"#, top + ph / 2.0, top + ph / 2.0).unwrap();
    writeln!(
        out,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    )
    .unwrap();
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.color,
            pts.join(" ")
        )
        .unwrap();
        for p in &s.points {
            writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/>"#,
                x(p.0),
                y(p.1),
                s.color
            )
            .unwrap();
        }
        let ly = top + 14.0 + 20.0 * i as f64;
        writeln!(out, r#"<line x1="{a}" x2="{b}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{t}" y="{ty}">{n}</text>"#, a = left + pw + 12.0, b = left + pw + 32.0, c = s.color, t = left + pw + 38.0, ty = ly + 4.0, n = s.name).unwrap();
    }
    out.push_str("</svg>\n");
    out
}
