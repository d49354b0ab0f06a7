//! The model's tokenizer from the worker itself (`GetTokenizer`), as SMG loads it when it is
//! given no model directory: the servicer zips the model's tokenizer files and streams them in
//! pieces, the SHA-256 on the last. The archive is checked against it, unpacked into a directory
//! of its own (the zip crate refuses entries that would land outside it) and loaded as a model
//! directory; the files a directory names on the command line always win.

use std::path::PathBuf;

use sha2::Digest;

use super::{Endpoint, GrpcUpstream};
use crate::tokens::{ModelFiles, Tokens, TokensError};

/// The most a tokenizer archive may take (a large vocabulary's files are tens of MB).
const MAX_ARCHIVE_BYTES: usize = 256 * 1024 * 1024;

/// Why the worker's tokenizer could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("GetTokenizer failed: {0}")]
    Call(#[from] tonic::Status),
    #[error("the tokenizer archive is over {MAX_ARCHIVE_BYTES} bytes")]
    TooLarge,
    #[error("the tokenizer archive's SHA-256 is {got}, the worker said {said}")]
    Digest { said: String, got: String },
    #[error("the tokenizer archive cannot be unpacked: {0}")]
    Archive(String),
    #[error(transparent)]
    Tokens(#[from] TokensError),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl GrpcUpstream {
    /// Loads the model's tokenizer from `endpoint` unless one is loaded already.
    /// Workers registering at once fetch one at a time: the first loads it, the others find it
    /// loaded.
    pub(crate) async fn fetch_tokenizer(&self, endpoint: &Endpoint) -> Result<(), FetchError> {
        if self.tokens.is_set() {
            return Ok(());
        }
        let _one_at_a_time = self.fetching.lock().await;
        if self.tokens.is_set() {
            return Ok(());
        }
        let mut pieces = self
            .client(endpoint)
            .get_tokenizer(sluice_proto::common::GetTokenizerRequest {})
            .await?
            .into_inner();
        let mut archive = Vec::new();
        let mut said = String::new();
        while let Some(piece) = pieces.message().await? {
            if archive.len() + piece.data.len() > MAX_ARCHIVE_BYTES {
                return Err(FetchError::TooLarge);
            }
            archive.extend_from_slice(&piece.data);
            if !piece.sha256.is_empty() {
                said = piece.sha256;
            }
        }
        let tokens = tokio::task::spawn_blocking(move || unpack(&archive, &said))
            .await
            .map_err(|e| FetchError::Archive(e.to_string()))??;
        self.tokens.set(std::sync::Arc::new(tokens));
        Ok(())
    }
}

/// Checks, unpacks and loads an archive (CPU and file work: off the runtime's threads).
fn unpack(archive: &[u8], said: &str) -> Result<Tokens, FetchError> {
    let got = hex(&sha2::Sha256::digest(archive));
    if !said.eq_ignore_ascii_case(&got) {
        return Err(FetchError::Digest {
            said: said.to_string(),
            got,
        });
    }
    // A directory of this unpacking's own, never one another could be reading or removing.
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "sluice-tokenizer-{}-{}-{:016x}",
        std::process::id(),
        &got[..16],
        rand::random::<u64>()
    ));
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(archive))
        .map_err(|e| FetchError::Archive(e.to_string()))?;
    zip.extract(&dir)
        .map_err(|e| FetchError::Archive(e.to_string()))?;
    let files = ModelFiles {
        model_path: Some(dir.clone()),
        ..ModelFiles::default()
    };
    let loaded = Tokens::load(&files);
    // The tokenizer is in memory now; the files are not needed.
    let _ = std::fs::remove_dir_all(&dir);
    Ok(loaded?)
}
