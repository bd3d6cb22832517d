//! The bench's picture, written as plain SVG: round-trip latency of port N-1 against N, and
//! wake-up latency against the length of the silence before it, one line per server (and
//! regime), both axes logarithmic.

use std::fmt::Write as _;

/// One line of a panel: its legend and its (x, y) points, x ascending.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 460.0;
const HEIGHT: f64 = 340.0;
const MARGIN: (f64, f64, f64, f64) = (70.0, 20.0, 40.0, 50.0); // left, right, top, bottom
const COLOURS: [&str; 6] = [
    "#1f77b4", "#aec7e8", "#d62728", "#ff9896", "#2ca02c", "#98df8a",
];

/// Both panels side by side.
pub fn plot(by_ports: &[Series], by_silence: &[Series]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{HEIGHT}" font-family="sans-serif" font-size="11">"#,
        2.0 * WIDTH
    );
    out += &panel(
        0.0,
        "round trip on port N-1 (ns, median)",
        "ports N",
        by_ports,
    );
    out += &panel(
        WIDTH,
        "first request after silence (µs, median)",
        "silence (µs)",
        by_silence,
    );
    out += "</svg>\n";
    out
}

fn panel(left: f64, title: &str, x_label: &str, series: &[Series]) -> String {
    let mut out = String::new();
    let points = series.iter().flat_map(|s| s.points.iter());
    let positive = |v: &f64| v.is_finite() && *v > 0.0;
    let xs: Vec<f64> = points.clone().map(|p| p.0).filter(positive).collect();
    let ys: Vec<f64> = points.map(|p| p.1).filter(positive).collect();
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="13">{title}</text>"#,
        left + WIDTH / 2.0
    );
    if xs.is_empty() || ys.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">no data</text>"#,
            left + WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return out;
    }
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        // Whole decades around the data.
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let ((x0, x1), (y0, y1)) = (range(&xs), range(&ys));
    let (ml, mr, mt, mb) = MARGIN;
    let sx = |x: f64| {
        left + ml + (x.log10() - x0.log10()) / (x1.log10() - x0.log10()) * (WIDTH - ml - mr)
    };
    let sy = |y: f64| {
        HEIGHT - mb - (y.log10() - y0.log10()) / (y1.log10() - y0.log10()) * (HEIGHT - mt - mb)
    };
    // Axes and decade grid lines.
    let _ = writeln!(
        out,
        r#"<rect x="{}" y="{mt}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        left + ml,
        WIDTH - ml - mr,
        HEIGHT - mt - mb
    );
    let mut decade = x0;
    while decade <= x1 * 1.0001 {
        let x = sx(decade);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{mt}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            HEIGHT - mb,
            HEIGHT - mb + 14.0,
            decade
        );
        decade *= 10.0;
    }
    let mut decade = y0;
    while decade <= y1 * 1.0001 {
        let y = sy(decade);
        let _ = writeln!(
            out,
            r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + ml,
            left + WIDTH - mr,
            left + ml - 4.0,
            y + 4.0,
            decade
        );
        decade *= 10.0;
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        left + ml + (WIDTH - ml - mr) / 2.0,
        HEIGHT - 12.0
    );
    // The lines, their points and the legend.
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| positive(&p.0) && positive(&p.1))
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for point in &path {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
        let ly = mt + 12.0 + 14.0 * k as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            left + ml + 8.0,
            left + ml + 26.0,
            left + ml + 30.0,
            ly + 4.0,
            s.name
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_has_a_line_per_series_and_a_point_per_value() {
        let series = [
            Series {
                name: "a".into(),
                points: vec![(64.0, 800.0), (16384.0, 900.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(64.0, 700.0), (1024.0, 7000.0), (16384.0, 20000.0)],
            },
        ];
        let svg = plot(&series, &[]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains("no data"), "the empty panel says so");
    }
}
