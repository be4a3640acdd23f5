//! The Prometheus text exposition format (version 0.0.4), the one
//! node_exporter serves and every Prometheus and `promtool check metrics`
//! reads.
//!
//! Written here rather than with the `prometheus-client` crate: that crate
//! only speaks OpenMetrics, whose counters are declared without their
//! `_total` suffix, and `promtool check metrics` (which reads the text
//! format) rejects every such sample as a metric without help. Values here
//! are snapshots taken at scrape time, so no registry is needed either.

use std::fmt::Write;

/// A family's type, as the format names it.
#[derive(Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Labels of one sample, in order.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// Writes families one after another into a string.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family. `name` carries its unit and, for a counter, the
    /// `_total` suffix, as the conventions ask.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        let kind_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind_name}");
        Family {
            out: &mut self.out,
            name: name.to_string(),
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// The samples of one family.
pub struct Family<'a> {
    out: &'a mut String,
    name: String,
}

impl Family<'_> {
    pub fn sample(&mut self, labels: Labels, value: f64) -> &mut Self {
        self.line(&self.name.clone(), labels, None, value);
        self
    }

    /// A histogram's series: `buckets` are (upper bound in the family's
    /// unit, count in that bucket alone), in increasing order; the open
    /// bucket's count is `count` minus their sum.
    pub fn histogram(
        &mut self,
        labels: Labels,
        buckets: &[(f64, u64)],
        count: u64,
        sum: f64,
    ) -> &mut Self {
        let name = self.name.clone();
        let mut cumulative = 0;
        for (bound, n) in buckets {
            cumulative += n;
            self.line(
                &format!("{name}_bucket"),
                labels,
                Some(&format_value(*bound)),
                cumulative as f64,
            );
        }
        self.line(
            &format!("{name}_bucket"),
            labels,
            Some("+Inf"),
            count as f64,
        );
        self.line(&format!("{name}_sum"), labels, None, sum);
        self.line(&format!("{name}_count"), labels, None, count as f64);
        self
    }

    fn line(&mut self, name: &str, labels: Labels, le: Option<&str>, value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() || le.is_some() {
            self.out.push('{');
            let mut first = true;
            for (k, v) in labels.iter().copied().chain(le.map(|l| ("le", l))) {
                if !first {
                    self.out.push(',');
                }
                first = false;
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", format_value(value));
    }
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Help text escapes backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_escape_labels_and_accumulate_buckets() {
        let mut e = Exposition::default();
        e.family("x_ops_total", Kind::Counter, "Ops.\nmore")
            .sample(&[("array", "a\"b\\c\nd")], 3.0);
        e.family("x_latency_seconds", Kind::Histogram, "Latency.")
            .histogram(&[("op", "read")], &[(0.001, 2), (0.01, 3)], 6, 0.5);
        let t = e.finish();
        assert_eq!(
            t,
            "# HELP x_ops_total Ops.\\nmore\n# TYPE x_ops_total counter\n\
             x_ops_total{array=\"a\\\"b\\\\c\\nd\"} 3\n\
             # HELP x_latency_seconds Latency.\n# TYPE x_latency_seconds histogram\n\
             x_latency_seconds_bucket{op=\"read\",le=\"0.001\"} 2\n\
             x_latency_seconds_bucket{op=\"read\",le=\"0.01\"} 5\n\
             x_latency_seconds_bucket{op=\"read\",le=\"+Inf\"} 6\n\
             x_latency_seconds_sum{op=\"read\"} 0.5\n\
             x_latency_seconds_count{op=\"read\"} 6\n"
        );
    }
}
