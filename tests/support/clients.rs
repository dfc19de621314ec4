//! gRPC clients we did not write, as programs the tests run: Python grpcio and Node.js grpc-js,
//! each through a small generic runner in `tests/clients/` (`cri_calls.py`, `cri_calls.js`) that
//! makes the calls it is given over one channel with its library's default options, and prints
//! each answer as JSON. The tests say what to call; the libraries do all of gRPC.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

use super::process::{in_ci, require_python_modules, require_tool};

const CLIENTS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");
const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");

/// A gRPC stack of its own: its HTTP/2, its `:authority`, its protobuf JSON mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Python grpcio (C-core), stubs compiled from `proto/` by grpcio-tools.
    Grpcio,
    /// Node.js `@grpc/grpc-js` with `@grpc/proto-loader` (pure JavaScript HTTP/2).
    GrpcJs,
}

impl Client {
    /// Every client whose runtime this machine has. Outside CI a missing one is skipped, saying
    /// so; in CI that fails.
    pub fn available() -> Vec<Client> {
        [Client::Grpcio, Client::GrpcJs].into_iter().filter(|client| client.program().is_some()).collect()
    }

    /// Whether this machine has this client (outside CI a missing one is skipped, saying so; in CI
    /// that fails).
    pub fn installed(self) -> bool {
        self.program().is_some()
    }

    /// The interpreter and runner of this client, when installed (see [`Client::available`]).
    fn program(self) -> Option<(PathBuf, PathBuf)> {
        match self {
            Client::Grpcio => {
                if !require_python_modules(&["grpc", "grpc_tools"]) {
                    return None;
                }
                Some((require_tool("python3")?, Path::new(CLIENTS_DIR).join("cri_calls.py")))
            }
            Client::GrpcJs => {
                let node = require_tool("node")?;
                let library = Path::new(CLIENTS_DIR).join("node_modules/@grpc/grpc-js");
                if !library.is_dir() {
                    assert!(!in_ci(), "{} is missing; CI must install it (scripts/install-deps.sh)", library.display());
                    eprintln!("SKIPPED: {} is missing (outside CI; `make deps` installs it)", library.display());
                    return None;
                }
                Some((node, Path::new(CLIENTS_DIR).join("cri_calls.js")))
            }
        }
    }

    /// Makes `calls` in order on one channel to `socket`, each awaited before the next; one
    /// answer per call. Blocks; panics when the runner itself fails.
    pub fn run(self, socket: &Path, calls: &[Call]) -> Vec<Answer> {
        let (interpreter, runner) = self.program().unwrap_or_else(|| panic!("{self:?} is not installed"));
        let input = serde_json::to_vec(&calls.iter().map(Call::to_json).collect::<Vec<_>>()).expect("calls as JSON");
        let mut child = Command::new(interpreter)
            .arg(runner)
            .arg(socket)
            .arg(PROTO_DIR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("{self:?} runner starts: {error}"));
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(&input).expect("write the calls");
        }
        let output = child.wait_with_output().expect("the runner ends");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{self:?} runner failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let answers: Vec<Answer> = stdout
            .lines()
            .map(|line| {
                let value: Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
                Answer::from_json(&value).unwrap_or_else(|| panic!("{self:?} printed {line}"))
            })
            .collect();
        assert_eq!(answers.len(), calls.len(), "{self:?} answered every call:\n{stdout}");
        answers
    }

    /// One call; see [`Client::run`].
    pub fn call(self, socket: &Path, method: &str, request: Value) -> Answer {
        self.run(socket, &[Call::new(method, request)]).remove(0)
    }

    /// One call that must succeed: its response.
    pub fn ok(self, socket: &Path, method: &str, request: Value) -> Value {
        match self.call(socket, method, request.clone()) {
            Answer::Ok(response) => response,
            Answer::Error { code, message } => panic!("{self:?} {method} {request}: {code}: {message}"),
        }
    }
}

/// One call: `method` is `package.Service/Method`, `request` the message as JSON with the
/// proto's field names (a server-streaming method's answer is the list of its messages), or raw
/// bytes for a method no proto describes.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub request: Value,
    /// The call's deadline; the runner's default (60 s) when `None`.
    pub timeout_ms: Option<u64>,
    /// The client cancels the call itself this long after making it.
    pub cancel_after_ms: Option<u64>,
    /// The request's bytes, for a method no proto describes; answered as base64.
    pub raw: Option<Vec<u8>>,
    /// A raw call whose answer is a stream.
    pub stream: bool,
    /// Sent with the call.
    pub metadata: Vec<(String, String)>,
}

impl Call {
    pub fn new(method: &str, request: Value) -> Self {
        Self {
            method: method.to_owned(),
            request,
            timeout_ms: None,
            cancel_after_ms: None,
            raw: None,
            stream: false,
            metadata: Vec::new(),
        }
    }

    /// A unary call of `method` with these bytes, which no proto describes.
    pub fn raw(method: &str, request: &[u8]) -> Self {
        Self { raw: Some(request.to_vec()), ..Self::new(method, Value::Null) }
    }

    /// A raw call whose answer is a stream of messages.
    pub fn streaming(self) -> Self {
        Self { stream: true, ..self }
    }

    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn timeout_ms(self, ms: u64) -> Self {
        Self { timeout_ms: Some(ms), ..self }
    }

    pub fn cancel_after_ms(self, ms: u64) -> Self {
        Self { cancel_after_ms: Some(ms), ..self }
    }

    fn to_json(&self) -> Value {
        use base64::Engine;
        let mut call = match &self.raw {
            Some(raw) => json!({ "method": self.method, "raw": base64::engine::general_purpose::STANDARD.encode(raw) }),
            None => json!({ "method": self.method, "request": self.request }),
        };
        if self.stream {
            call["stream"] = true.into();
        }
        if !self.metadata.is_empty() {
            call["metadata"] =
                self.metadata.iter().map(|(key, value)| (key.clone(), Value::from(value.clone()))).collect();
        }
        if let Some(ms) = self.timeout_ms {
            call["timeout_ms"] = ms.into();
        }
        if let Some(ms) = self.cancel_after_ms {
            call["cancel_after_ms"] = ms.into();
        }
        call
    }
}

/// What one call got: the response, or the status code's name and message.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Ok(Value),
    Error { code: String, message: String },
}

impl Answer {
    fn from_json(value: &Value) -> Option<Self> {
        if let Some(response) = value.get("ok") {
            return Some(Answer::Ok(response.clone()));
        }
        let error = value.get("error")?;
        Some(Answer::Error { code: error["code"].as_str()?.to_owned(), message: error["message"].as_str()?.to_owned() })
    }

    /// The status code's name, `OK` for a response.
    pub fn code(&self) -> &str {
        match self {
            Answer::Ok(_) => "OK",
            Answer::Error { code, .. } => code,
        }
    }
}
