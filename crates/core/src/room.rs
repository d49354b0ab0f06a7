//! How many client connections a gateway can take with the files it may open.
//!
//! Every client connection is one open file. Over HTTP/1.1 a busy one holds a second, its
//! connection to a worker, so only half of what is left fits; over HTTP/2 a worker takes one
//! connection whatever the number of streams on it, so every client connection fits. A fixed
//! reserve stays for everything else (listeners, probes, the access log, the runtime).

/// Open files kept out of the client connections' share.
pub const FILES_KEPT: usize = 64;

/// The client connections `open_files` leaves room for: `(open_files - FILES_KEPT) / 2` when
/// workers may be spoken to over HTTP/1.1, `open_files - FILES_KEPT - workers` when every one
/// speaks HTTP/2 (one connection each). Never less than one.
pub fn client_connections(open_files: usize, every_worker_http2: bool, workers: usize) -> usize {
    let left = open_files.saturating_sub(FILES_KEPT);
    let room = if every_worker_http2 {
        left.saturating_sub(workers)
    } else {
        left / 2
    };
    room.max(1)
}

/// The soft open-file limit from the text of `/proc/<pid>/limits` (Linux); `None` when it is
/// unlimited or the line is missing.
pub fn open_file_limit(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            20000                524288               files     \n";
        assert_eq!(open_file_limit(limits), Some(20_000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(open_file_limit(unlimited), None);
        assert_eq!(open_file_limit(""), None);
    }

    #[test]
    fn http1_halves_what_the_reserve_leaves() {
        assert_eq!(client_connections(20_000, false, 4), 9_968);
        assert_eq!(client_connections(1_024, false, 0), 480);
    }

    #[test]
    fn http2_takes_one_file_per_worker() {
        assert_eq!(client_connections(20_000, true, 4), 19_932);
    }

    #[test]
    fn a_tiny_limit_still_leaves_one() {
        assert_eq!(client_connections(10, false, 0), 1);
        assert_eq!(client_connections(70, true, 100), 1);
    }
}
