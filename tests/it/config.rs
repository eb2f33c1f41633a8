//! Config loading, diagnostics and the committed JSON Schema.

use std::path::{Path, PathBuf};

use gpuprov::config::{json_schema, Cloud, Config};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(Path::new("gpuprov.toml"), text.to_string()).map_err(|e| {
        let span = e
            .span
            .map(|s| text[s.offset()..s.offset() + s.len()].to_string());
        format!("{} | at {:?}", e.message, span)
    })
}

#[test]
fn committed_schema_is_current() {
    let path = root().join("schemas/gpuprov.schema.json");
    let fresh = json_schema();
    if std::env::var_os("GPUPROV_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "schemas/gpuprov.schema.json is stale: run `GPUPROV_UPDATE_SCHEMAS=1 cargo nextest run -E 'test(config::)'` and commit it"
    );
}

/// Issue 19: the JSON Schemas of the `-json` outputs (plan, status, list, offers,
/// validate) are generated from their types.
#[test]
fn committed_output_schemas_are_current() {
    for (name, fresh) in gpuprov::cli::view::json::schemas() {
        let path = root().join("schemas").join(name);
        if std::env::var_os("GPUPROV_UPDATE_SCHEMAS").is_some() {
            std::fs::write(&path, &fresh).unwrap();
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == fresh,
            "schemas/{name} is stale: run `GPUPROV_UPDATE_SCHEMAS=1 cargo nextest run -E 'test(config::)'` and commit it"
        );
        let schema: serde_json::Value = serde_json::from_str(&fresh).unwrap();
        jsonschema::validator_for(&schema).expect("schema compiles");
    }
}

#[test]
fn committed_state_schema_is_current_and_accepts_a_real_state() {
    let path = root().join("schemas/gpuprov-state.schema.json");
    let fresh = gpuprov::state::json_schema();
    if std::env::var_os("GPUPROV_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap_or_default() == fresh,
        "schemas/gpuprov-state.schema.json is stale: run `GPUPROV_UPDATE_SCHEMAS=1 cargo nextest run -E 'test(config::)'` and commit it"
    );
    let schema: serde_json::Value = serde_json::from_str(&fresh).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let mut state = gpuprov::state::StateFile::new();
    let mut rec = gpuprov::state::ResourceRecord::new(gpuprov::state::MachineRecord {
        kind: "launch".into(),
        state: serde_json::json!({"state": "planning", "round": 0}).into(),
        label: "planning".into(),
        updated_at: chrono::Utc::now(),
    });
    rec.push_event("planning");
    state.resources.insert("vm.dev".into(), rec);
    let v = serde_json::to_value(&state).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!validator.is_valid(&serde_json::json!({"version": "one"})));
}

#[test]
fn every_example_loads_and_validates_against_the_schema() {
    let schema: serde_json::Value = serde_json::from_str(&json_schema()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        n += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("#:schema ../schemas/gpuprov.schema.json"),
            "{} lacks the #:schema line",
            path.display()
        );
        Config::load(&path).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let as_json: serde_json::Value =
            serde_json::to_value(toml::from_str::<toml::Table>(&text).unwrap()).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&as_json)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }
    assert!(n >= 2, "examples/ holds the example configs");
}

#[test]
fn schema_rejects_what_the_loader_rejects() {
    let schema: serde_json::Value = serde_json::from_str(&json_schema()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let bad: serde_json::Value =
        serde_json::json!({"vm": {"a": {"clouds": ["docker"], "gpus": 1}}});
    assert!(
        !validator.is_valid(&bad),
        "unknown key must fail the schema too"
    );
    let bad_cloud = serde_json::json!({"vm": {"a": {"clouds": ["awz"]}}});
    assert!(!validator.is_valid(&bad_cloud));
}

#[test]
fn defaults_merge_under_each_machine() {
    let c = parse(
        r#"
[defaults]
clouds = ["aws", "lambda"]
max_price_per_hour = 3.0
spot = true

[vm.a]
gpu = "H100"

[vm.b]
clouds = ["docker"]
spot = false
kubernetes = false
depends_on = ["a"]
"#,
    )
    .unwrap();
    let a = &c.vms["a"];
    assert_eq!(a.clouds, vec![Cloud::Aws, Cloud::Lambda]);
    assert_eq!(
        (a.gpu.as_deref(), a.gpu_count, a.spot),
        (Some("H100"), 1, true)
    );
    assert_eq!(a.max_price_per_hour, Some(3.0));
    assert!(a.kubernetes && !a.kubernetes_explicit);
    let b = &c.vms["b"];
    assert_eq!(b.clouds, vec![Cloud::Docker]);
    assert!(!b.spot && !b.kubernetes);
    assert_eq!(b.depends_on, vec!["a"]);
}

/// Each bad config → (what the message must say, the text the span must cover).
#[test]
fn bad_configs_name_what_and_where() {
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("[vm.a]\nclouds = [\"docker\"]\ngpus = 2\n", "unknown field `gpus`", Some("gpus")),
        ("[vm.a]\nclouds = [\"docker\"]\ndisk_gb = \"big\"\n", "invalid type", Some("\"big\"")),
        ("[vm.a]\nclouds = [\"awz\"]\n", "unknown variant `awz`", Some("\"awz\"")),
        (
            "[vm.a]\nclouds = [\"docker\"]\ndepends_on = [\"b\"]\n[vm.b]\nclouds = [\"docker\"]\ndepends_on = [\"a\"]\n",
            "depends_on forms a cycle: a -> b -> a",
            Some("\"b\""),
        ),
        ("[vm.a]\nclouds = [\"docker\"]\ndepends_on = [\"nope\"]\n", "depends on \"nope\", which is not defined", Some("\"nope\"")),
        ("[vm.A_b]\nclouds = [\"docker\"]\n", "invalid machine name", Some("[vm.A_b]")),
        ("[vm.a]\nregions = [\"x\"]\n", "names no cloud", Some("[vm.a]")),
        ("[vm.a]\nclouds = []\n", "clouds is empty", Some("[]")),
        ("[vm.a]\nclouds = [\"docker\"]\nports = [22]\n", "port 22 cannot be listed", Some("[22]")),
        ("[vm.a]\nclouds = [\"docker\"]\nports = [8080, 9000, 8080]\n", "port 8080 is listed twice", Some("[8080, 9000, 8080]")),
        (
            "[vm.a]\nclouds = [\"docker\"]\n[vm.b]\nclouds = [\"docker\"]\ndepends_on = [\"a\", \"a\"]\n",
            "depends_on lists \"a\" twice",
            Some("\"a\""),
        ),
        ("[vm.a]\nclouds = [\"docker\"]\nimage = \"${var.image}\" # ${ok in a comment}\n", "does not interpolate", Some("\"${var.image}\"")),
        ("[defaults]\nregions = [\"us-east-1\", \"${region}\"]\n[vm.a]\nclouds = [\"docker\"]\n", "does not interpolate", Some("\"${region}\"")),
        ("[vm.a]\nclouds = [\"docker\"]\nmax_price_per_hour = -1.0\n", "must be a positive number", Some("-1.0")),
        ("[defaults]\nmax_price_per_hour = 0.0 # free\n[vm.a]\nclouds = [\"docker\"]\n", "must be a positive number", Some("0.0")),
        ("[vm.a]\nclouds = [\"docker\"]\ngpu_count = 2\n", "no gpu model is set", Some("2")),
        ("[vm.a]\nclouds = [\"docker\"]\ndisk_gb = 0\n", "disk_gb must be at least 1 GiB", Some("0")),
        ("[vm.a\nclouds = 1\n", "invalid config", None),
        ("", "defines no machine", None),
        ("[vm.a]\nclouds = [\"docker\"]\n[vm.a]\nclouds = [\"docker\"]\n", "duplicate", None),
    ];
    for (text, want_msg, want_span) in cases {
        let got = parse(text).expect_err(&format!("must reject:\n{text}"));
        assert!(
            got.contains(want_msg),
            "for\n{text}\nexpected {want_msg:?} in {got:?}"
        );
        if let Some(span) = want_span {
            assert!(
                got.contains(&format!("at Some({span:?})")),
                "for\n{text}\nexpected span {span:?}, got {got:?}"
            );
        }
    }
}

/// `${` in a comment is not a value: only strings are checked for interpolation.
#[test]
fn interpolation_in_a_comment_is_fine() {
    let cfg = parse("# image = \"${var.image}\"\n[vm.a]\nclouds = [\"docker\"] # ${not a value}\n")
        .expect("comments may hold ${");
    assert_eq!(cfg.vms["a"].image, None);
}

/// Issue 34 item 7: each cloud has its own `[cloud.NAME]` type, so a key only another
/// cloud takes (or no cloud) is refused with a diagnostic naming the key and the cloud,
/// at the key, however the table is written; an unknown cloud names the known ones.
#[test]
fn a_key_another_cloud_takes_is_refused_naming_key_and_cloud() {
    let vm = "[vm.a]\nclouds = [\"docker\"]\n";
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "[cloud.lambda]\nproject = \"x\"\n",
            "[cloud.lambda] has no key `project`",
            "project",
            "`project` is a key of [cloud.gcp] only",
        ),
        (
            "[cloud.gcp]\nprojects = { eu-north1 = \"p\" }\n",
            "[cloud.gcp] has no key `projects`",
            "projects",
            "`projects` is a key of [cloud.nebius] only",
        ),
        (
            "[cloud.aws]\nbase_image = \"debian\"\n",
            "[cloud.aws] has no key `base_image`",
            "base_image",
            "`base_image` is a key of [cloud.docker] only",
        ),
        (
            "[cloud.docker]\nendpoint = \"unix:///x.sock\"\nregion = \"local\"\n",
            "[cloud.docker] has no key `region`",
            "region",
            "[cloud.docker] takes `endpoint`, `keep_shared`, `base_image`",
        ),
        (
            "[cloud]\nlambda.project = \"x\"\n",
            "[cloud.lambda] has no key `project`",
            "project",
            "[cloud.lambda] takes `endpoint`, `keep_shared`;",
        ),
        (
            "cloud.runpod = { keep_shared = true, project = \"x\" }\n",
            "[cloud.runpod] has no key `project`",
            "project",
            "[cloud.gcp]",
        ),
        (
            "[cloud.nimbus]\nendpoint = \"http://127.0.0.1:1\"\n",
            "unknown cloud `nimbus` in [cloud.nimbus]",
            "nimbus",
            "known clouds: aws, gcp,",
        ),
    ];
    for (table, want_msg, want_span, want_help) in cases {
        let text = format!("{table}{vm}");
        let e = Config::parse(Path::new("gpuprov.toml"), text.clone())
            .expect_err(&format!("must reject:\n{text}"));
        assert!(
            e.message.contains(want_msg),
            "for\n{text}\nexpected {want_msg:?} in {:?}",
            e.message
        );
        let span = e.span.expect("the diagnostic points at the key");
        assert_eq!(
            &text[span.offset()..span.offset() + span.len()],
            *want_span,
            "for\n{text}"
        );
        let help = e.help.unwrap_or_default();
        assert!(
            help.contains(want_help),
            "for\n{text}\nexpected {want_help:?} in help {help:?}"
        );
    }
}

/// Issue 34 item 7: every cloud takes `endpoint` and `keep_shared`, and gcp, nebius and
/// docker their own keys; the core reads the common ones through one accessor.
#[test]
fn each_cloud_takes_the_common_keys_and_its_own() {
    let mut text = String::from("[vm.a]\nclouds = [\"docker\"]\n");
    for (i, c) in Cloud::ALL.iter().enumerate() {
        text.push_str(&format!(
            "\n[cloud.{c}]\nendpoint = \"http://127.0.0.1:{}\"\nkeep_shared = {}\n",
            9000 + i,
            i % 2 == 0
        ));
        match c {
            Cloud::Gcp => text.push_str("project = \"gpuprov-test\"\n"),
            Cloud::Nebius => text.push_str("projects = { eu-north1 = \"project-e00a\" }\n"),
            Cloud::Docker => text.push_str("base_image = \"debian:bookworm\"\n"),
            _ => {}
        }
    }
    let cfg = Config::parse(Path::new("gpuprov.toml"), text.clone())
        .unwrap_or_else(|e| panic!("{text}\n{e:?}"));
    assert_eq!(cfg.clouds.present().collect::<Vec<_>>(), Cloud::ALL);
    for (i, c) in Cloud::ALL.iter().enumerate() {
        let common = cfg.clouds.common(*c);
        let want = format!("http://127.0.0.1:{}", 9000 + i);
        assert_eq!(common.endpoint, Some(want.as_str()), "{c}");
        assert_eq!(common.keep_shared, i % 2 == 0, "{c}");
    }
    let gcp = cfg.clouds.gcp.as_ref().unwrap();
    assert_eq!(gcp.project.as_deref(), Some("gpuprov-test"));
    let nebius = cfg.clouds.nebius.as_ref().unwrap();
    assert_eq!(
        nebius.projects.as_ref().unwrap()["eu-north1"],
        "project-e00a"
    );
    let docker = cfg.clouds.docker.as_ref().unwrap();
    assert_eq!(docker.base_image.as_deref(), Some("debian:bookworm"));
    // A config without `[cloud]` reads as every key unset.
    let bare = parse("[vm.a]\nclouds = [\"docker\"]\n").unwrap();
    assert_eq!(bare.clouds.present().count(), 0);
    assert_eq!(bare.clouds.common(Cloud::Lambda), Default::default());
}

/// Issue 34 item 7: the committed schema describes each cloud's own table, so an editor
/// completes (and flags) per-cloud keys as the loader does.
#[test]
fn schema_checks_cloud_tables_per_cloud() {
    let schema: serde_json::Value = serde_json::from_str(&json_schema()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let ok = serde_json::json!({
        "vm": {"a": {"clouds": ["gcp"]}},
        "cloud": {
            "gcp": {"project": "p", "keep_shared": true},
            "nebius": {"projects": {"eu-north1": "project-e00a"}},
            "docker": {"base_image": "debian", "endpoint": "unix:///x.sock"},
            "lambda": {"endpoint": "http://127.0.0.1:1"}
        }
    });
    let errors: Vec<String> = validator.iter_errors(&ok).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    for bad in [
        serde_json::json!({"cloud": {"lambda": {"project": "p"}}}),
        serde_json::json!({"cloud": {"aws": {"base_image": "debian"}}}),
        serde_json::json!({"cloud": {"gcp": {"projects": {}}}}),
        serde_json::json!({"cloud": {"nimbus": {}}}),
    ] {
        assert!(!validator.is_valid(&bad), "the schema must refuse {bad}");
    }
}
