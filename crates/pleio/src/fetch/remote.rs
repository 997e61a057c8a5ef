//! The gather of a table published to Redis: the distinct rows, sorted,
//! read in one pipelined round per node and checked row by row
//! ([`crate::remote::RemoteTable::read`]), then decoded into each request
//! slot. Nothing is written to the output before every row was read and
//! checked.

use super::{with_staged, GatherError, GatherStats, Table};
use crate::output::Out;
use crate::remote::RemoteTable;

impl Table {
    pub(super) fn gather_remote(
        &self,
        remote: &RemoteTable,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        if rows.is_empty() {
            return Ok(());
        }
        let rb = self.shared.table.row_bytes() as usize;
        with_staged(|st| {
            // Distinct rows ascending; `slots[i]` is request i's place among them.
            let mut order: Vec<(u64, usize)> = rows.iter().copied().zip(0..).collect();
            order.sort_unstable();
            let mut distinct = Vec::with_capacity(rows.len());
            let mut slots = vec![0usize; rows.len()];
            for &(r, i) in &order {
                if distinct.last() != Some(&r) {
                    distinct.push(r);
                }
                slots[i] = distinct.len() - 1;
            }
            st.bytes.clear();
            st.bytes.resize(distinct.len() * rb, 0);
            let mut records = Vec::new();
            remote.read(&distinct, &mut st.bytes, &mut records)?;
            stats.read_bytes += (distinct.len() * rb) as u64;
            stats.backend = Some("redis");
            for (i, &k) in slots.iter().enumerate() {
                out.put(i, &st.bytes[k * rb..(k + 1) * rb], &self.decoder)?;
            }
            Ok(())
        })
    }
}

impl Table {
    /// Publishes this table to Redis at `url` (`redis://HOST:PORT/NAME`,
    /// see [`crate::remote::store::publish`]): its stored rows, read with
    /// `pread` bucket by bucket, its geometry, row format and row-id
    /// mapping. `source` is what the manifest records as its origin;
    /// `opts` the bucket size and the check of earlier runs' buckets;
    /// `progress(done, total)` follows the buckets.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn publish(
        &self,
        url: &str,
        source: &str,
        opts: &crate::remote::PublishOptions,
        progress: impl FnMut(u64, u64),
    ) -> Result<crate::remote::Published, crate::Error> {
        let layout = &self.shared.table;
        let mut files: Vec<usize> = layout.regions().map(|r| r.file).collect();
        files.sort_unstable();
        files.dedup();
        let row_ids = self.row_ids().ok();
        let src = crate::remote::store::Source {
            layout,
            files: files.iter().map(|&f| self.file_path(f).to_path_buf()).collect(),
            source: source.to_string(),
            row_ids: row_ids.as_ref(),
            ple_layers: self.ple_layers(),
            layer: self.layer(),
        };
        let mut rows = Vec::new();
        let read = |first: u64, n: u64, out: &mut [u8]| {
            rows.clear();
            rows.extend(first..first + n);
            self.gather_as_with(super::Strategy::Pread, crate::Dtype::Raw, &rows, out)
                .map(|_| ())
        };
        crate::remote::publish(&src, url, opts, read, progress)
    }
}
