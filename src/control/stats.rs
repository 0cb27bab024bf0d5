//! Allocation-free statistics for the control thread: a fixed-bucket histogram (the live
//! counters other threads read are `crate::telemetry::LiveStats`).

/// Linear histogram with `bucket_ns` resolution up to `buckets * bucket_ns`; larger samples fall
/// into an overflow count but still update `max`. Allocates only in `new`.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    bucket_ns: u64,
    counts: Vec<u32>,
    overflow: u64,
    count: u64,
    max_ns: u64,
}

impl Histogram {
    pub(crate) fn new(bucket_ns: u64, buckets: usize) -> Histogram {
        Histogram {
            bucket_ns,
            counts: vec![0; buckets],
            overflow: 0,
            count: 0,
            max_ns: 0,
        }
    }

    pub(crate) fn record(&mut self, ns: u64) {
        let i = (ns / self.bucket_ns) as usize;
        match self.counts.get_mut(i) {
            Some(c) => *c = c.saturating_add(1),
            None => self.overflow += 1,
        }
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Upper edge of the bucket holding quantile `q` (0..=1); 0 when empty.
    pub(crate) fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen >= rank {
                return ((i as u64 + 1) * self.bucket_ns).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_recorded_samples() {
        let mut h = Histogram::new(1_000, 100);
        for us in 1..=100u64 {
            h.record(us * 1_000 - 500);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_ns(0.5), 50_000);
        assert_eq!(h.quantile_ns(0.99), 99_000);
        assert_eq!(h.max_ns(), 99_500);
        h.record(10_000_000);
        assert_eq!(h.max_ns(), 10_000_000);
        assert_eq!(h.quantile_ns(1.0), 10_000_000);
    }
}
