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

/// A line chart of `series` on linear axes starting at zero.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 70.0, 190.0, 40.0, 50.0);
    let xmax = nice_max(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold(0.0, f64::max),
    );
    let ymax = nice_max(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let (pw, ph) = (w - left - right, h - top - bottom);
    let x = |v: f64| left + v / xmax * pw;
    let y = |v: f64| top + ph - v / ymax * ph;
    let mut out = String::new();
    writeln!(out, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#).unwrap();
    writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#).unwrap();
    writeln!(
        out,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{title}</text>"#,
        left + pw / 2.0
    )
    .unwrap();
    for i in 0..=5 {
        let (fx, fy) = (xmax * i as f64 / 5.0, ymax * i as f64 / 5.0);
        writeln!(out, r##"<line x1="{l}" x2="{r}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{tx}" y="{ty}" text-anchor="end">{fy}</text>"##, l = left, r = left + pw, yy = y(fy), tx = left - 6.0, ty = y(fy) + 4.0).unwrap();
        writeln!(
            out,
            r##"<text x="{xx}" y="{ty}" text-anchor="middle">{fx}</text>"##,
            xx = x(fx),
            ty = top + ph + 18.0
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
