//! The environment overrides a container sets (`DEDUPE_*`), applied to the parsed file
//! before validation.

use super::file::{FileAdmin, FileConfig};

impl FileConfig {
    /// Applies the environment overrides a container sets (`DEDUPE_LISTEN`,
    /// `DEDUPE_UPSTREAM`, `DEDUPE_REDIS_URL`, `DEDUPE_REDIS_URLS`, `DEDUPE_ADMIN_LISTEN`,
    /// `DEDUPE_ADMIN_TOKEN`). `lookup` is the environment; tests pass a map.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        if let Some(v) = lookup("DEDUPE_LISTEN") {
            self.server.listen = v;
        }
        if let Some(v) = lookup("DEDUPE_UPSTREAM") {
            self.server.upstream = v;
        }
        if let Some(v) = lookup("DEDUPE_REDIS_URL") {
            self.store.url = Some(v);
        }
        if let Some(v) = lookup("DEDUPE_REDIS_URLS") {
            self.store.urls = Some(v.split(',').map(|s| s.trim().to_owned()).collect());
        }
        if let Some(v) = lookup("DEDUPE_ADMIN_LISTEN") {
            match &mut self.admin {
                Some(admin) => admin.listen = v,
                None => {
                    self.admin = Some(FileAdmin {
                        listen: v,
                        token: None,
                    })
                }
            }
        }
        if let Some(v) = lookup("DEDUPE_ADMIN_TOKEN") {
            if let Some(admin) = &mut self.admin {
                admin.token = Some(v);
            }
        }
    }
}
