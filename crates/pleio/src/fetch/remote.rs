//! The gather of a table published to Redis: the request grouped as the
//! row cache groups it (`cached::group_request`), the distinct rows read
//! in one pipelined round per node and checked row by row
//! ([`crate::remote::RemoteTable::read`]) into staging, then decoded into
//! each request slot (`cached::put_groups`). Nothing is written to the
//! output before every row was read and checked.

use super::cached::{group_request, put_groups};
use super::direct::with_scratch;
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
        let rb = self.shared.table.row_bytes() as usize;
        with_scratch(|s| {
            with_staged(|st| {
                let groups = group_request(self, s, st, rows, out)?;
                let distinct: Vec<u64> = groups.iter().map(|g| g.row).collect();
                let staged = &mut st.bytes;
                let bytes = remote.read(&distinct, &mut |k, b| {
                    staged[k * rb..(k + 1) * rb].copy_from_slice(b)
                })?;
                stats.read_bytes += bytes;
                stats.backend = Some("redis");
                put_groups(out, &s.order, &groups, &st.bytes, rb, &self.decoder, &mut st.ordered)?;
                Ok(())
            })
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
        let files = self.shared.backends.used();
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
