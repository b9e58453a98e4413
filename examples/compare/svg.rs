//! `--svg FILE`: total throughput by threads, one panel per family of limiters.

use crate::measure::{Series, find};
use crate::stats::median;
use std::fmt::Write as _;

/// The plot's panels: one family each, a few series, ours first. Series absent from a run are
/// left out.
pub(crate) const PANELS: [(&str, &[&str]); 4] = [
    (
        "GCRA",
        &["Gcra", "Sharded<Gcra>", "MutexGcra (std)", "governor check"],
    ),
    (
        "Token bucket",
        &[
            "TokenBucket",
            "MutexTokenBucket (std)",
            "MutexTokenBucket (parking_lot)",
            "ratelimit try_wait",
        ],
    ),
    (
        "Windows",
        &[
            "FixedWindow",
            "SlidingWindowCounter",
            "MutexFixedWindow (std)",
            "MutexSlidingWindowCounter (std)",
            "SlidingWindowLog (mutex)",
        ],
    ),
    (
        "Coarse clock (one load per check)",
        &[
            "Sharded<Gcra> + CoarseClock",
            "MutexTokenBucket (std) + CoarseClock",
            "governor check + coarse clock",
        ],
    ),
];

/// A line's look by whose it is: ours solid, the mutex baselines dashed, the other crates dotted;
/// colours from one qualitative palette, distinct within a panel.
pub(crate) fn line_style(name: &str, k: usize) -> (&'static str, &'static str) {
    const COLOURS: [&str; 5] = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"];
    let dash = if name.starts_with("Mutex") || name.contains("(mutex)") {
        "6,4"
    } else if name.starts_with("governor") || name.starts_with("ratelimit") {
        "2,3"
    } else {
        "none"
    };
    (COLOURS[k % COLOURS.len()], dash)
}

/// `text` with XML's special characters escaped (subject names hold `<` and `>`).
pub(crate) fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Total throughput by threads, one small panel per family (each with its own scale), axes
/// labelled, a legend per panel.
pub(crate) fn svg(threads: &[usize], rows: &[(usize, Vec<Series>)]) -> String {
    let (pw, ph) = (450.0, 340.0);
    let (left, right, top, bottom) = (58.0, 20.0, 34.0, 112.0);
    let (w, h) = (2.0 * pw, 2.0 * ph + 36.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        s,
        "<text x=\"12\" y=\"22\" font-size=\"15\">Total throughput on one limiter, by threads (median Mops/s; solid: ours, dashed: mutex, dotted: other crates)</text>"
    );
    for (p, (title, names)) in PANELS.iter().enumerate() {
        let (ox, oy) = ((p % 2) as f64 * pw, 36.0 + (p / 2) as f64 * ph);
        let series: Vec<(&str, Vec<f64>)> = names
            .iter()
            .filter(|n| rows.iter().all(|(_, v)| v.iter().any(|s| s.name == **n)))
            .map(|n| {
                (
                    *n,
                    rows.iter()
                        .map(|(_, v)| median(&find(v, n).samples))
                        .collect(),
                )
            })
            .collect();
        let max = series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(1.0, f64::max)
            * 1.15;
        let (x0, x1, y0, y1) = (ox + left, ox + pw - right, oy + top, oy + ph - bottom);
        let x = |i: usize| x0 + (x1 - x0) * i as f64 / (threads.len().max(2) - 1) as f64;
        let y = |v: f64| y1 - (y1 - y0) * v / max;
        let _ = writeln!(
            s,
            "<text x=\"{x0}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>",
            oy + 20.0,
            xml(title)
        );
        for k in 0..=4 {
            let v = max * f64::from(k) / 4.0;
            let _ = writeln!(
                s,
                "<line x1=\"{x0}\" y1=\"{0:.1}\" x2=\"{x1}\" y2=\"{0:.1}\" stroke=\"#e4e4e4\"/>\n<text x=\"{1}\" y=\"{2:.1}\" text-anchor=\"end\">{v:.0}</text>",
                y(v),
                x0 - 5.0,
                y(v) + 4.0
            );
        }
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y1}\" x2=\"{x1}\" y2=\"{y1}\" stroke=\"black\"/>\n<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>"
        );
        for (i, t) in threads.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
                x(i),
                y1 + 14.0
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">threads</text>\n<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">Mops/s</text>",
            (x0 + x1) / 2.0,
            y1 + 30.0,
            ox + 14.0,
            (y0 + y1) / 2.0
        );
        for (k, (name, values)) in series.iter().enumerate() {
            let (colour, dash) = line_style(name, k);
            let pts: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>",
                pts.join(" ")
            );
            // The legend sits under the panel's axis, one line per series.
            let ly = y1 + 46.0 + 14.0 * k as f64;
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{1:.1}\" x2=\"{2}\" y2=\"{1:.1}\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n<text x=\"{3}\" y=\"{4:.1}\">{5}</text>",
                x0,
                ly,
                x0 + 22.0,
                x0 + 28.0,
                ly + 4.0,
                xml(name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
