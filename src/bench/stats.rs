//! Samples of repeated runs: medians, percentiles, ratios. The machines these run on are
//! noisy, so reports use medians of repeated runs and ratios of runs measured side by side.

use std::time::Duration;

/// Timings of one measured quantity, in the order they were taken.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
}

impl Samples {
    pub fn new() -> Samples {
        Samples::default()
    }
    pub fn push(&mut self, d: Duration) {
        self.values.push(d.as_secs_f64() * 1e3);
    }
    /// A raw value in the sample's own unit (milliseconds for durations).
    pub fn push_value(&mut self, v: f64) {
        self.values.push(v);
    }
    /// The `i`-th value taken.
    pub fn value(&self, i: usize) -> f64 {
        self.values[i]
    }
    pub fn len(&self) -> usize {
        self.values.len()
    }
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }
    /// The `q`-quantile (nearest rank), `q` in 0..=1; NaN when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = (q * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }
    /// The median: the mean of the two middle values for an even count.
    pub fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
    pub fn p90(&self) -> f64 {
        self.quantile(0.9)
    }
    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }
    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
    /// Element-wise `self[i] / other[i]` (runs taken side by side).
    pub fn ratio_to(&self, other: &Samples) -> Samples {
        Samples {
            values: self
                .values
                .iter()
                .zip(&other.values)
                .map(|(a, b)| a / b)
                .collect(),
        }
    }
    /// `median, p90, min–max` in milliseconds, for reports.
    pub fn summary_ms(&self) -> String {
        format!(
            "median {:.2} ms, p90 {:.2} ms, min {:.2} ms, max {:.2} ms (n={})",
            self.median(),
            self.p90(),
            self.min(),
            self.max(),
            self.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quantiles() {
        let mut s = Samples::new();
        for v in [5.0, 1.0, 3.0, 2.0, 4.0] {
            s.push_value(v);
        }
        assert_eq!(s.median(), 3.0);
        assert_eq!(s.p90(), 5.0);
        assert_eq!(s.quantile(0.5), 3.0);
        assert_eq!((s.min(), s.max()), (1.0, 5.0));
        s.push_value(6.0);
        assert_eq!(s.median(), 3.5);
        let mut t = Samples::new();
        for _ in 0..6 {
            t.push_value(2.0);
        }
        assert_eq!(s.ratio_to(&t).median(), 1.75);
        assert!(Samples::new().median().is_nan());
        let mut d = Samples::new();
        d.push(Duration::from_micros(1500));
        assert_eq!(d.median(), 1.5);
    }
}
