//! Golden tests of `gpuprov validate`'s credential report: per configured cloud, where the
//! credential was found or every place it looked, and exit 1 when a configured cloud has
//! none. No cloud is dialled: every endpoint is a closed loopback port, and HOME and the
//! XDG directories are a temp dir, so no vendor CLI's config (doctl, runpodctl) is found.
//! Each case is its own snapshot file (`it__validate__*.snap`): the wording comes from the
//! adapters' `credentials()` and is reviewed with them.

use assert_cmd::Command;

/// Every credential variable of the REST clouds; cleared for every run.
const CREDENTIALS: &[&str] = &[
    "LAMBDA_API_KEY",
    "DIGITALOCEAN_TOKEN",
    "DIGITALOCEAN_ACCESS_TOKEN",
    "RUNPOD_API_KEY",
    "HYPERSTACK_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "CLOUDSDK_CONFIG",
    "GCE_METADATA_HOST",
];

/// A closed port on loopback: a call that escaped would be refused at once.
const CLOSED: &str = "http://127.0.0.1:9";

const CONFIG: &str = "[defaults]\nclouds = [\"lambda\", \"digitalocean\", \"runpod\", \"hyperstack\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\n";

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(config: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), config).unwrap();
        for d in ["home", "config", "data", "cache", "state"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Project { dir }
    }

    /// `gpuprov validate` with no credential in the environment, plus `env`.
    fn validate(&self, env: &[(&str, &str)]) -> (i32, String, String) {
        let p = self.dir.path();
        let mut c = Command::cargo_bin("gpuprov").unwrap();
        c.current_dir(p)
            .env("NO_COLOR", "1")
            .env("GPUPROV_HOME", p.join("gpuprov-home"))
            .env("HOME", p.join("home"))
            .env("XDG_CONFIG_HOME", p.join("config"))
            .env("XDG_DATA_HOME", p.join("data"))
            .env("XDG_CACHE_HOME", p.join("cache"))
            .env("XDG_STATE_HOME", p.join("state"))
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE");
        for v in CREDENTIALS {
            c.env_remove(v);
        }
        for cloud in ["LAMBDA", "DIGITALOCEAN", "RUNPOD", "HYPERSTACK", "GCP"] {
            c.env(format!("GPUPROV_{cloud}_ENDPOINT"), CLOSED);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.arg("validate").output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Snapshots a run under filters for the temp directory.
    fn snap(&self, name: &str, code: i32, stdout: &str, stderr: &str) {
        let mut s = insta::Settings::clone_current();
        let tmp = self.dir.path().display().to_string();
        let escaped: String = tmp
            .chars()
            .flat_map(|c| {
                let meta = "\\.+*?()|[]{}^$#&-~".contains(c);
                meta.then_some('\\').into_iter().chain([c])
            })
            .collect();
        s.add_filter(&escaped, "[TMP]");
        s.bind(|| {
            insta::assert_snapshot!(
                name,
                format!("exit: {code}\n--- stdout\n{stdout}--- stderr\n{stderr}")
            )
        });
    }
}

#[test]
fn no_credential_anywhere_names_where_each_cloud_looked_and_exits_1() {
    let p = Project::new(CONFIG);
    let (code, out, err) = p.validate(&[]);
    assert_eq!(code, 1, "{out}\n{err}");
    for cloud in ["lambda", "digitalocean", "runpod", "hyperstack"] {
        assert!(
            out.contains(&format!("  {cloud}: NO credential (looked in")),
            "{cloud}: {out}"
        );
    }
    assert!(out.contains("LAMBDA_API_KEY"), "{out}");
    assert!(out.contains("DIGITALOCEAN_TOKEN"), "{out}");
    assert!(out.contains("RUNPOD_API_KEY"), "{out}");
    assert!(out.contains("HYPERSTACK_API_KEY"), "{out}");
    p.snap("no_credential", code, &out, &err);
}

#[test]
fn lambda_and_digitalocean_without_credentials() {
    let p = Project::new(
        "[defaults]\nclouds = [\"lambda\", \"digitalocean\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\n",
    );
    let (code, out, err) = p.validate(&[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("  lambda: NO credential"), "{out}");
    assert!(out.contains("  digitalocean: NO credential"), "{out}");
    assert!(
        !out.contains("runpod") && !out.contains("hyperstack"),
        "{out}"
    );
    p.snap("lambda_and_digitalocean_no_credential", code, &out, &err);
}

#[test]
fn a_lambda_key_in_the_environment_is_found_there() {
    let p = Project::new(CONFIG);
    let (code, out, err) = p.validate(&[("LAMBDA_API_KEY", "secret_sentinel_key_7f3a9c")]);
    assert!(
        out.contains("  lambda: credential found in the LAMBDA_API_KEY environment variable"),
        "{out}"
    );
    assert!(
        !out.contains("secret_sentinel_key_7f3a9c") && !err.contains("secret_sentinel_key_7f3a9c")
    );
    assert_eq!(code, 1, "the other clouds still have none: {out}\n{err}");
    p.snap("lambda_key_in_env", code, &out, &err);
}

#[test]
fn lambda_alone_with_its_key_is_valid() {
    let p = Project::new(
        "[defaults]\nclouds = [\"lambda\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\n",
    );
    let (code, out, err) = p.validate(&[("LAMBDA_API_KEY", "secret_sentinel_key_7f3a9c")]);
    assert!(
        out.contains("  lambda: credential found in the LAMBDA_API_KEY environment variable"),
        "{out}"
    );
    assert_eq!(code, 0, "{out}\n{err}");
    p.snap("lambda_alone_with_key", code, &out, &err);
}

#[test]
fn gcp_without_a_credential_names_adc_s_places_and_a_bad_key_file_says_why() {
    let p = Project::new(
        "[defaults]\nclouds = [\"gcp\"]\nkubernetes = false\n\n[cloud.gcp]\nproject = \"gpuprov-test\"\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\n",
    );
    let (code, out, err) = p.validate(&[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("  gcp: NO credential (looked in"), "{out}");
    assert!(out.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{out}");
    assert!(
        out.contains("application_default_credentials.json"),
        "{out}"
    );
    assert!(out.contains("metadata server"), "{out}");
    p.snap("gcp_no_credential", code, &out, &err);
    std::fs::write(
        p.dir.path().join("key.json"),
        r#"{"type": "external_account", "audience": "s3cr3t"}"#,
    )
    .unwrap();
    let (code, out, err) = p.validate(&[("GOOGLE_APPLICATION_CREDENTIALS", "key.json")]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("external_account") && !out.contains("s3cr3t"),
        "{out}"
    );
}
