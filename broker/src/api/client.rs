//! The user side of the gateway API (`socialweb-broker api ...`): a DID key in a file, a
//! fresh service-auth token per call, JSON in and out, and kubeconfigs written owner-only.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::auth::token::{self, SigningKey};

/// How long the tokens the CLI signs are good for.
const TOKEN_SECS: i64 = 60;

/// A caller: who, with which key, at which gateway.
#[derive(Debug)]
pub struct Caller {
    gateway: String,
    key: SigningKey,
    did: String,
    aud: Option<String>,
    http: reqwest::Client,
}

/// Reads a key file written by [`write_key`].
pub fn read_key(path: &Path) -> Result<SigningKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--key: reading {}", path.display()))?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .with_context(|| format!("--key: {} holds no key", path.display()))?;
    SigningKey::from_multibase(line).map_err(|e| anyhow::anyhow!("--key: {}: {e}", path.display()))
}

/// Writes a new key to `path` (mode 0600, refusing to overwrite one), returns its did:key.
/// Missing directories on the way are made owner-only (`~/.config/socialweb` on a new
/// machine).
pub fn write_key(path: &Path, key: &SigningKey) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("--out: making {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("--out: creating {} (it must not exist)", path.display()))?;
    writeln!(
        f,
        "# {} private key of {}\n{}",
        match key.alg() {
            atrium_crypto::Algorithm::P256 => "P-256",
            atrium_crypto::Algorithm::Secp256k1 => "secp256k1",
        },
        key.did(),
        key.to_multibase()
    )?;
    f.sync_all()?;
    Ok(key.did())
}

/// Writes `contents` to `path` mode 0600 (replacing a file there, atomically).
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    crate::pki::write_private(path, contents.as_bytes(), 0o600)
}

impl Caller {
    /// `did`: whose DID the key is (default: the key's own did:key). `ca_pem`: the gateway's
    /// CA when it is not one the system trusts (a broker's self-made front CA).
    pub fn new(
        gateway: &str,
        key: SigningKey,
        did: Option<String>,
        aud: Option<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Caller> {
        crate::crypto_provider();
        let mut b = reqwest::Client::builder()
            .https_only(true)
            .timeout(Duration::from_secs(330));
        if let Some(pem) = ca_pem {
            b = b.tls_certs_only(
                reqwest::Certificate::from_pem_bundle(pem).context("--ca: not PEM certificates")?,
            );
        }
        Ok(Caller {
            gateway: gateway.trim_end_matches('/').to_string(),
            did: did.unwrap_or_else(|| key.did()),
            key,
            aud,
            http: b.build()?,
        })
    }

    pub fn did(&self) -> &str {
        &self.did
    }

    async fn send(
        &self,
        method: &str,
        query: &[(String, String)],
        input: Option<&Value>,
        auth: bool,
    ) -> Result<Value> {
        let url = format!("{}/xrpc/{method}", self.gateway);
        let mut req = match input {
            Some(body) => self.http.post(&url).json(body),
            None => self.http.get(&url).query(query),
        };
        if auth {
            let aud = match &self.aud {
                Some(a) => a.clone(),
                None => Box::pin(self.describe()).await?["did"]
                    .as_str()
                    .context("describeServer gave no did")?
                    .to_string(),
            };
            let t = token::sign(
                &self.key,
                &self.did,
                &aud,
                method,
                TOKEN_SECS,
                SystemTime::now(),
            );
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.with_context(|| format!("calling {url}"))?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("{method}: the answer ({status}) is not JSON"))?;
        if !status.is_success() {
            bail!(
                "{method}: {status}: {}: {}",
                body["error"].as_str().unwrap_or("Error"),
                body["message"].as_str().unwrap_or("")
            );
        }
        Ok(body)
    }

    /// `describeServer` (no token).
    pub async fn describe(&self) -> Result<Value> {
        self.send(super::DESCRIBE_SERVER, &[], None, false).await
    }

    /// A query (GET) with parameters.
    pub async fn query(&self, method: &str, params: &[(String, String)]) -> Result<Value> {
        self.send(method, params, None, true).await
    }

    /// A procedure (POST) with a JSON input.
    pub async fn procedure(&self, method: &str, input: &Value) -> Result<Value> {
        self.send(method, &[], Some(input), true).await
    }
}
