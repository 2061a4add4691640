//! What the apiserver's own metrics say about its storage after a run: write and read errors
//! against the datastore, and how well its watch caches kept up with it. A cache that lags
//! the datastore makes a watch at a fresh resource version fail with "Too large resource
//! version" after 3 s, and a consistent list fall back to the datastore; a cache whose watch
//! broke is initialized again (a relist), refusing some requests meanwhile.

/// The figures, from the text of `/metrics`.
#[derive(Debug, Default, PartialEq)]
pub struct Storage {
    /// `etcd_request_errors_total`: the apiserver's failed datastore requests.
    pub request_errors: u64,
    /// `apiserver_watch_cache_initializations_total`, summed.
    pub cache_initializations: u64,
    /// How many resources' caches were initialized at least once (their first is not a
    /// lag: `cache_initializations - cache_resources` is how often one started again).
    pub cache_resources: u64,
    /// Requests that waited for a cache to reach their resource version, and those that
    /// waited longer than 1 s (`apiserver_watch_cache_read_wait_seconds`).
    pub read_waits: u64,
    pub read_waits_over_1s: u64,
    /// Consistent lists the cache could not serve in 3 s, sent to the datastore instead.
    pub consistent_read_fallbacks: u64,
    /// Watchers the apiserver ended because they could not keep up.
    pub terminated_watchers: u64,
}

impl Storage {
    pub fn parse(text: &str) -> Storage {
        let mut s = Storage::default();
        let (mut waits_under_1s, mut waits) = (0.0, 0.0);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or_default();
            match name {
                "etcd_request_errors_total" => s.request_errors += v as u64,
                "apiserver_watch_cache_initializations_total" => {
                    s.cache_initializations += v as u64;
                    s.cache_resources += u64::from(v > 0.0);
                }
                "apiserver_watch_cache_read_wait_seconds_count" => waits += v,
                "apiserver_watch_cache_read_wait_seconds_bucket" if series.contains("le=\"1\"") => {
                    waits_under_1s += v
                }
                "apiserver_watch_cache_consistent_read_total"
                    if series.contains("fallback=\"true\"") =>
                {
                    s.consistent_read_fallbacks += v as u64
                }
                "apiserver_terminated_watchers_total" => s.terminated_watchers += v as u64,
                _ => {}
            }
        }
        s.read_waits = waits as u64;
        s.read_waits_over_1s = (waits - waits_under_1s).max(0.0) as u64;
        s
    }

    /// As `name=value` lines.
    pub fn figures(&self) -> String {
        format!(
            "storage_request_errors={}\nwatch_cache_initializations={}\nwatch_cache_resources={}\n\
             watch_cache_read_waits={}\nwatch_cache_read_waits_over_1s={}\n\
             watch_cache_consistent_read_fallbacks={}\nterminated_watchers={}\n",
            self.request_errors,
            self.cache_initializations,
            self.cache_resources,
            self.read_waits,
            self.read_waits_over_1s,
            self.consistent_read_fallbacks,
            self.terminated_watchers
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as kube-apiserver v1.34 writes them.
    const SAMPLE: &str = r#"# HELP etcd_request_errors_total [ALPHA] Etcd failed request counts for each operation and object type.
# TYPE etcd_request_errors_total counter
etcd_request_errors_total{operation="listWithCount",type="/registry/configmaps"} 1
etcd_request_errors_total{operation="get",type="/registry/pods"} 2
apiserver_watch_cache_initializations_total{group="",resource="configmaps"} 3
apiserver_watch_cache_initializations_total{group="",resource="pods"} 1
apiserver_watch_cache_read_wait_seconds_bucket{group="",resource="configmaps",le="0.8"} 7
apiserver_watch_cache_read_wait_seconds_bucket{group="",resource="configmaps",le="1"} 8
apiserver_watch_cache_read_wait_seconds_bucket{group="",resource="configmaps",le="+Inf"} 10
apiserver_watch_cache_read_wait_seconds_count{group="",resource="configmaps"} 10
apiserver_watch_cache_read_wait_seconds_bucket{group="",resource="pods",le="1"} 4
apiserver_watch_cache_read_wait_seconds_count{group="",resource="pods"} 4
apiserver_watch_cache_consistent_read_total{fallback="true",group="",resource="pods",success="true"} 2
apiserver_watch_cache_consistent_read_total{fallback="false",group="",resource="pods",success="true"} 90
apiserver_terminated_watchers_total{group="",resource="pods"} 1
"#;

    #[test]
    fn the_apiservers_storage_figures_are_read_from_its_metrics() {
        assert_eq!(
            Storage::parse(SAMPLE),
            Storage {
                request_errors: 3,
                cache_initializations: 4,
                cache_resources: 2,
                read_waits: 14,
                read_waits_over_1s: 2,
                consistent_read_fallbacks: 2,
                terminated_watchers: 1,
            }
        );
        assert_eq!(Storage::parse(""), Storage::default());
    }
}
