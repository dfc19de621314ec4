//! The daemon as the commands see it: one connection, every call bounded by `--timeout` (but a
//! pull's), every failed call a [`CliError`] that says what to do.

use std::{path::PathBuf, time::Duration};

use tonic::{Request, Response, Status, transport::Channel};

use super::{CliError, connect};
use crate::{api, api::image_manager_client::ImageManagerClient, config::client::Connection};

pub struct Daemon {
    pub socket: PathBuf,
    timeout: Duration,
    pub client: ImageManagerClient<Channel>,
}

impl Daemon {
    pub async fn connect(connection: &Connection) -> Result<Self, CliError> {
        let channel = connect::connect(&connection.socket, connection.timeout).await?;
        Ok(Self {
            socket: connection.socket.clone(),
            timeout: connection.timeout,
            client: ImageManagerClient::new(channel),
        })
    }

    /// `message` with the `--timeout` deadline.
    pub fn timed<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// The message of an answer, or its error for a person.
    pub async fn answer<T>(
        &mut self,
        answer: Result<Response<T>, Status>,
        method: &'static str,
    ) -> Result<T, CliError> {
        match answer {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => Err(self.error(&status, method).await),
        }
    }

    /// `status` for a person; for an older daemon, with its version.
    pub async fn error(&mut self, status: &Status, method: &'static str) -> CliError {
        let mut error = CliError::from_status(status, &self.socket, method);
        if let CliError::TooOld { version, .. } = &mut error
            && let Ok(answer) = self.client.get_status(self.timed(api::GetStatusRequest::default())).await
        {
            *version = answer.into_inner().version;
        }
        error
    }

    pub async fn status(&mut self, request: api::GetStatusRequest) -> Result<api::GetStatusResponse, CliError> {
        let answer = self.client.get_status(self.timed(request)).await;
        self.answer(answer, "GetStatus").await
    }
}
