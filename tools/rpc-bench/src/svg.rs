//! The bench's picture, drawn with `plotters` as SVG (its text is SVG `<text>`: no font is
//! read, so nothing depends on the machine's fonts). Three panels, one under the other, each
//! with its legend in a column of its own beside the plot, never over the data:
//! - round trip on port N-1 against the ports N, a line per server and regime;
//! - the first request after a silence against its length;
//! - the throughput rows (printf lines/s, pipelined exchanges/s), a line per row and a point
//!   per server, so rpc-serve and LLVM sit side by side.
//!
//! Every point is a median with a bar from the least to the greatest repetition. A server is
//! a colour; the quiet regime is solid lines and filled points, the loaded one dashed lines and
//! hollow points. Both axes of the first two panels are logarithmic and fitted to the data, as
//! is the throughput axis.

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One value of a series: where it goes on x, and the median, least and greatest of its
/// repetitions.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub x: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// One line of a panel: its legend, its colour (an index into the palette), its regime and
/// its points, x ascending.
pub struct Series {
    pub name: String,
    pub colour: usize,
    pub loaded: bool,
    pub points: Vec<Point>,
}

/// The throughput panel: the rows' names, top to bottom, and a series per server whose
/// points' x is the index of their row.
pub struct Rates {
    pub rows: Vec<String>,
    pub series: Vec<Series>,
}

const WIDTH: u32 = 1000;
/// The legend column at the right of each panel.
const LEGEND_WIDTH: u32 = 250;
const LATENCY_HEIGHT: u32 = 380;
const WAKE_HEIGHT: u32 = 320;
/// The throughput panel: room for the title and axis, and a band per row.
const RATES_BASE: u32 = 110;
const RATES_PER_ROW: u32 = 30;
/// The throughput panel's units of height per row (an integer axis, so that each row's label
/// sits at its band's middle and the servers' points spread over the band).
const BAND: i32 = 12;
/// The servers' colours, strong enough to tell apart in both regimes.
const PALETTE: [RGBColor; 5] = [
    RGBColor(0x1f, 0x5f, 0xbf),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1a, 0x8f, 0x3a),
    RGBColor(0x8e, 0x44, 0xad),
    RGBColor(0xe6, 0x7e, 0x22),
];
/// The floor's colour in the latency panel: the palette's last.
pub const FLOOR_COLOUR: usize = PALETTE.len() - 1;
/// The legend box's fill (the tests find the box by it).
pub const LEGEND_FILL: RGBColor = RGBColor(0xfc, 0xfc, 0xfc);
/// The frame around each plotting area (the tests find the frames by it).
pub const FRAME: RGBColor = RGBColor(0x44, 0x44, 0x44);
/// Quiet and loaded points of the same x are drawn this factor apart, so their bars do not
/// hide each other.
const DODGE: f64 = 1.06;

/// The three panels, one under the other.
pub fn plot(latency: &[Series], wake: &[Series], rates: &Rates) -> String {
    let rates_height = RATES_BASE + RATES_PER_ROW * rates.rows.len().max(3) as u32;
    let height = LATENCY_HEIGHT + WAKE_HEIGHT + rates_height;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        let drawn = root.fill(&WHITE).map_err(|e| e.to_string()).and_then(|()| {
            let (top, rest) = root.split_vertically(LATENCY_HEIGHT);
            let (middle, bottom) = rest.split_vertically(WAKE_HEIGHT);
            log_panel(
                &top,
                "round trip on port N-1 (ns)",
                "ports N",
                "ns",
                latency,
            )?;
            log_panel(
                &middle,
                "first request after a silence (µs)",
                "silence (µs)",
                "µs",
                wake,
            )?;
            rates_panel(&bottom, rates)?;
            root.present().map_err(|e| e.to_string())
        });
        if let Err(why) = drawn {
            eprintln!("rpc-bench: the picture is incomplete: {why}");
        }
    }
    out
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The least and greatest positive finite values, widened a little on a log scale: the axis
/// fitted to the data. `None` without such a value.
pub fn log_range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    (hi > 0.0).then(|| (lo / 1.25, hi * 1.25))
}

/// The ticks of a log axis from `lo` to `hi`: 1, 2 and 5 times the powers of ten between them
/// (plotters' own crowd their labels over a decade or less).
fn log_keys(lo: f64, hi: f64) -> Vec<f64> {
    // Over more than three decades, the powers of ten alone.
    let steps: &[f64] = if hi / lo > 1e3 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    let mut keys = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        keys.extend(
            steps
                .iter()
                .map(|step| step * decade)
                .filter(|k| (lo..=hi).contains(k)),
        );
        decade *= 10.0;
    }
    keys
}

/// A value as a log axis from `lo` can show it: a 0 (a repetition in which nothing
/// completed, say) at the start of the axis.
fn at_least(lo: f64) -> impl Fn(f64) -> f64 {
    move |v| if v > lo { v } else { lo }
}

/// The legend's note on values of 0, where there are any.
fn zero_note<'p>(mut points: impl Iterator<Item = &'p Point>) -> &'static str {
    if points.any(|p| p.min <= 0.0 || p.min.is_nan()) {
        " A 0 is drawn at the start of the axis."
    } else {
        ""
    }
}

/// A value as an axis label: at most three figures, with k or M.
fn short(value: f64) -> String {
    let (scaled, suffix) = match value.abs() {
        v if v >= 1e6 => (value / 1e6, "M"),
        v if v >= 1e4 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let text = if scaled.abs() >= 100.0 || scaled.fract().abs() < 1e-9 {
        format!("{scaled:.0}")
    } else if scaled.abs() >= 10.0 {
        format!("{scaled:.1}")
    } else {
        format!("{scaled:.2}")
    };
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    text + suffix
}

fn style(series: &Series) -> ShapeStyle {
    PALETTE[series.colour % PALETTE.len()].stroke_width(2)
}

/// A point's marker: filled in the quiet regime, hollow in the loaded one.
fn marker(series: &Series) -> ShapeStyle {
    let colour = PALETTE[series.colour % PALETTE.len()];
    if series.loaded {
        colour.stroke_width(2)
    } else {
        colour.filled()
    }
}

/// Where a series' points go on a dodged log axis: quiet a little left, loaded a little right.
fn dodged(series: &Series, x: f64) -> f64 {
    if series.loaded {
        x * DODGE.sqrt()
    } else {
        x / DODGE.sqrt()
    }
}

/// A panel of series on log-log axes, its legend beside it.
fn log_panel(
    area: &Area<'_>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    let (plot, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().map(move |p| (s, p)))
    };
    let xs = log_range(points().map(|(s, p)| dodged(s, p.x)));
    let ys = log_range(points().flat_map(|(_, p)| [p.min, p.median, p.max]));
    let (Some((x0, x1)), Some((y0, y1))) = (xs, ys) else {
        return no_data(&plot, title);
    };
    let mut keys: Vec<f64> = points().map(|(_, p)| p.x).collect();
    keys.sort_by(f64::total_cmp);
    keys.dedup();
    let mut chart = builder(&plot, title, 64)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(keys),
            (y0..y1).log_scale().with_key_points(log_keys(y0, y1)),
        )
        .map_err(|e| e.to_string())?;
    draw_mesh(
        &mut chart,
        x_label,
        Some(y_label),
        &|v| format!("{v}"),
        &|v| short(*v),
    )?;
    let y = at_least(y0);
    for s in series {
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (dodged(s, p.x), y(p.median)))
            .collect();
        if s.loaded {
            chart.draw_series(DashedLineSeries::new(line, 7, 5, style(s)))
        } else {
            chart.draw_series(LineSeries::new(line, style(s)))
        }
        .map_err(|e| e.to_string())?;
        for p in &s.points {
            let x = dodged(s, p.x);
            spread(&mut chart, s, [(x, y(p.min)), (x, y(p.max))], true)?;
            chart
                .draw_series([Circle::new((x, y(p.median)), 4, marker(s))])
                .map_err(|e| e.to_string())?;
        }
    }
    let regimes = if series.iter().any(|s| s.loaded) {
        "solid, filled: quiet; dashed, hollow: loaded (a CPU kept busy)."
    } else {
        "quiet regime."
    };
    let note = format!(
        "bars: least to greatest of the repetitions; {regimes}{}",
        zero_note(points().map(|(_, p)| p))
    );
    legend(
        &legend_area,
        series.iter().map(|s| (s.name.as_str(), s)),
        &note,
    )
}

/// The bar from a point's least to its greatest repetition, with caps.
fn spread<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    series: &Series,
    ends: [(X::ValueType, Y::ValueType); 2],
    vertical: bool,
) -> Result<(), String>
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    let thin = PALETTE[series.colour % PALETTE.len()].stroke_width(1);
    let cap: Vec<(i32, i32)> = if vertical {
        vec![(-4, 0), (4, 0)]
    } else {
        vec![(0, -4), (0, 4)]
    };
    chart
        .draw_series([PathElement::new(ends.to_vec(), thin)])
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(
            ends.into_iter()
                .map(|end| EmptyElement::at(end) + PathElement::new(cap.clone(), thin)),
        )
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A panel's chart in the house style: `title` above, the margins, the x axis's labels and
/// `y_labels` pixels for the y axis's.
fn builder<'a, 'b>(
    plot: &'a Area<'b>,
    title: &str,
    y_labels: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(plot);
    builder
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(y_labels);
    builder
}

/// The chart's mesh in the house style, its axes described by `x_desc` and `y_desc` and
/// labelled by the formatters, then its frame.
fn draw_mesh<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: Option<&str>,
    x_labels: &dyn Fn(&X::ValueType) -> String,
    y_labels: &dyn Fn(&Y::ValueType) -> String,
) -> Result<(), String>
where
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    let mut mesh = chart.configure_mesh();
    if let Some(desc) = y_desc {
        mesh.y_desc(desc);
    }
    mesh.x_desc(x_desc)
        .x_label_formatter(x_labels)
        .y_label_formatter(y_labels)
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(|e| e.to_string())?;
    frame(chart)
}

/// A frame around the plotting area (the mesh draws only the left and bottom axes).
fn frame<X: Ranged, Y: Ranged>(
    chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
) -> Result<(), String> {
    let area = chart.plotting_area().strip_coord_spec();
    let (w, h) = area.dim_in_pixel();
    area.draw(&Rectangle::new(
        [(0, 0), (w as i32 - 1, h as i32 - 1)],
        FRAME.stroke_width(1),
    ))
    .map_err(|e| e.to_string())
}

/// A panel with nothing to plot says so.
fn no_data(plot: &Area<'_>, title: &str) -> Result<(), String> {
    let (w, h) = plot.dim_in_pixel();
    let centre = ("sans-serif", 14)
        .into_text_style(plot)
        .pos(Pos::new(HPos::Center, VPos::Center));
    plot.draw(&Text::new(
        format!("{title}: no data"),
        (w as i32 / 2, h as i32 / 2),
        centre,
    ))
    .map_err(|e| e.to_string())
}

/// The legend in its own column: a framed box, an entry per series (a line sample, solid or
/// dashed, and a marker, filled or hollow), and a note under it.
fn legend<'s>(
    area: &Area<'_>,
    entries: impl Iterator<Item = (&'s str, &'s Series)>,
    note: &str,
) -> Result<(), String> {
    let entries: Vec<(&str, &Series)> = entries.collect();
    if entries.is_empty() {
        return Ok(());
    }
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let (left, top, line) = (8, 40, 20);
    let bottom = top + 12 + line * entries.len() as i32;
    let right = LEGEND_WIDTH as i32 - 8;
    area.draw(&Rectangle::new(
        [(left, top), (right, bottom)],
        LEGEND_FILL.filled(),
    ))
    .map_err(err)?;
    area.draw(&Rectangle::new(
        [(left, top), (right, bottom)],
        RGBColor(0x99, 0x99, 0x99).stroke_width(1),
    ))
    .map_err(err)?;
    let font = ("sans-serif", 12).into_font().color(&BLACK);
    for (k, (name, series)) in entries.iter().enumerate() {
        let y = top + 16 + line * k as i32;
        let (a, b) = (left + 8, left + 40);
        if series.loaded {
            for (from, to) in [(a, a + 9), (a + 14, a + 23), (a + 28, b)] {
                area.draw(&PathElement::new(vec![(from, y), (to, y)], style(series)))
                    .map_err(err)?;
            }
        } else {
            area.draw(&PathElement::new(vec![(a, y), (b, y)], style(series)))
                .map_err(err)?;
        }
        area.draw(&Circle::new(((a + b) / 2, y), 4, marker(series)))
            .map_err(err)?;
        area.draw(&Text::new(name.to_string(), (b + 8, y - 7), font.clone()))
            .map_err(err)?;
    }
    let small = ("sans-serif", 11)
        .into_font()
        .color(&RGBColor(0x55, 0x55, 0x55));
    let mut y = bottom + 8;
    for words in wrap(note, 38) {
        area.draw(&Text::new(words, (left, y), small.clone()))
            .map_err(err)?;
        y += 14;
    }
    Ok(())
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// The throughput rows: a row each (top to bottom), a point per server on a log axis.
fn rates_panel(area: &Area<'_>, rates: &Rates) -> Result<(), String> {
    let title = "throughput (printf: lines/s; pipelined: exchanges/s)";
    let (plot, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let rows = rates.rows.len();
    let values = rates
        .series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|p| [p.min, p.median, p.max]));
    let Some((x0, x1)) = log_range(values).filter(|_| rows > 0) else {
        return no_data(&plot, title);
    };
    // Row i is the band [BAND * (rows - 1 - i), BAND * (rows - i)), so the first row is at
    // the top; its label at the band's middle, the servers' points spread over the band.
    let band = |i: usize| BAND * (rows - 1 - i) as i32;
    let servers = rates.series.len().max(1) as i32;
    let y_of =
        |k: usize, row: f64| band(row as usize) + BAND * (servers - k as i32) / (servers + 1);
    let keys: Vec<i32> = (0..rows).map(|i| band(i) + BAND / 2).collect();
    let names = rates.rows.clone();
    let label = move |y: &i32| {
        let from_top = rows as i32 - 1 - y.div_euclid(BAND);
        usize::try_from(from_top)
            .ok()
            .and_then(|i| names.get(i))
            .cloned()
            .unwrap_or_default()
    };
    let mut chart = builder(&plot, title, 250)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(log_keys(x0, x1)),
            (0..BAND * rows as i32).with_key_points(keys),
        )
        .map_err(|e| e.to_string())?;
    draw_mesh(&mut chart, "per second", None, &|v| short(*v), &label)?;
    let x = at_least(x0);
    for (k, s) in rates.series.iter().enumerate() {
        for p in &s.points {
            let y = y_of(k, p.x);
            spread(&mut chart, s, [(x(p.min), y), (x(p.max), y)], false)?;
            chart
                .draw_series([Circle::new((x(p.median), y), 4, marker(s))])
                .map_err(|e| e.to_string())?;
        }
    }
    legend(
        &legend_area,
        rates.series.iter().map(|s| (s.name.as_str(), s)),
        &format!(
            "bars: least to greatest of the repetitions; quiet regime.{}",
            zero_note(rates.series.iter().flat_map(|s| &s.points))
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_fitted_to_the_data() {
        let (lo, hi) = log_range([64.0, 1024.0, 16384.0, f64::NAN, 0.0]).unwrap();
        assert!(
            (40.0..64.0).contains(&lo) && (16384.0..25000.0).contains(&hi),
            "{lo} {hi}"
        );
        assert_eq!(log_range([f64::NAN, -1.0]), None);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(short(64.0), "64");
        assert_eq!(short(16384.0), "16.4k");
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(short(0.25), "0.25");
    }
}
