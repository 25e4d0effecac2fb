//! The environment overrides a container sets (`DEDUPE_*`), applied to the parsed file
//! before validation.

use super::file::{EnvOverride, FileAdmin, FileConfig};

/// What `DEDUPE_REDIS_PASSWORD` sets. The file has no field for it (a password in the file
/// would sit beside everything else in a config map), so errors and `--help` name it in
/// words rather than as a field that does not exist.
pub const REDIS_PASSWORD: &str = "the Redis password";

/// Every variable that overrides the configuration, with what it sets: a field of the file,
/// or [`REDIS_PASSWORD`], which the file has no field for. What `dedupe-gateway --help` and
/// the man page list. A test holds it to [`FileConfig::apply_env`].
pub const ENV_OVERRIDES: [(&str, &str); 7] = [
    ("DEDUPE_LISTEN", "server.listen"),
    ("DEDUPE_UPSTREAM", "server.upstream"),
    ("DEDUPE_REDIS_URL", "store.url"),
    ("DEDUPE_REDIS_URLS", "store.urls"),
    ("DEDUPE_REDIS_PASSWORD", REDIS_PASSWORD),
    ("DEDUPE_ADMIN_LISTEN", "admin.listen"),
    ("DEDUPE_ADMIN_TOKEN", "admin.token"),
];

impl FileConfig {
    /// Applies the environment overrides a container sets (`DEDUPE_LISTEN`,
    /// `DEDUPE_UPSTREAM`, `DEDUPE_REDIS_URL`, `DEDUPE_REDIS_URLS`, `DEDUPE_ADMIN_LISTEN`,
    /// `DEDUPE_ADMIN_TOKEN`, `DEDUPE_REDIS_PASSWORD`). `lookup` is the environment; tests
    /// pass a map. An error in a value set here names the variable, not the file.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        let mut set = |var: &'static str, field: &'static str| {
            let v = lookup(var)?;
            self.from_env.push(EnvOverride { field, var });
            Some(v)
        };
        let listen = set("DEDUPE_LISTEN", "server.listen");
        let upstream = set("DEDUPE_UPSTREAM", "server.upstream");
        let url = set("DEDUPE_REDIS_URL", "store.url");
        let urls = set("DEDUPE_REDIS_URLS", "store.urls");
        let admin_listen = set("DEDUPE_ADMIN_LISTEN", "admin.listen");
        let admin_token = set("DEDUPE_ADMIN_TOKEN", "admin.token");
        let password = set("DEDUPE_REDIS_PASSWORD", REDIS_PASSWORD);
        if password.is_some() {
            self.store.password = password;
        }
        if let Some(v) = listen {
            self.server.listen = v;
        }
        if let Some(v) = upstream {
            self.server.upstream = v;
        }
        if let Some(v) = url {
            self.store.url = Some(v);
        }
        if let Some(v) = urls {
            self.store.urls = Some(v.split(',').map(|s| s.trim().to_owned()).collect());
        }
        if let Some(v) = admin_listen {
            match &mut self.admin {
                Some(admin) => admin.listen = v,
                None => {
                    self.admin = Some(FileAdmin {
                        listen: v,
                        token: None,
                        max_connections: None,
                        allow_unauthenticated: None,
                    })
                }
            }
        }
        if let Some(v) = admin_token {
            if let Some(admin) = &mut self.admin {
                admin.token = Some(v);
            }
        }
    }

    /// The variable that set `field`, if one did.
    pub(super) fn env_var_for(&self, field: &str) -> Option<&'static str> {
        self.from_env
            .iter()
            .find(|o| o.field == field)
            .map(|o| o.var)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_overrides_are_the_ones_applied() {
        let mut file = FileConfig::parse(
            "[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://127.0.0.1:2\"\n",
        )
        .unwrap();
        let asked = std::cell::RefCell::new(Vec::new());
        file.apply_env(|var| {
            asked.borrow_mut().push(var.to_owned());
            Some("x".to_owned())
        });
        let mut applied: Vec<(&str, &str)> =
            file.from_env.iter().map(|o| (o.var, o.field)).collect();
        let mut listed = ENV_OVERRIDES.to_vec();
        applied.sort_unstable();
        listed.sort_unstable();
        assert_eq!(applied, listed);
        let mut asked = asked.into_inner();
        asked.sort_unstable();
        assert_eq!(asked, listed.iter().map(|(v, _)| *v).collect::<Vec<_>>());
    }
}
