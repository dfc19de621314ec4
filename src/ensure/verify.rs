//! KEP-2535: whether a pod may use an image already present, from the pull records and the
//! verification policy.

use super::{EnsureError, EnsureRequest, Manager, VerificationConfig};
use crate::{
    credentials::CredentialSource,
    pull::path::{account_record, secret_record},
    records::{
        RecordsError, check,
        format::{SecretRecord, ServiceAccountRecord},
        metrics::CheckResult,
        verification::{self, VerificationPolicy},
    },
    runtime::ImageRuntime,
};

impl<R: ImageRuntime> Manager<R> {
    /// KEP-2535: whether the pod may use the present image `image_ref` without pulling it with
    /// its own credentials. Records that cannot be read mean no: the pod pulls (fail safe).
    pub(super) async fn may_use_present(
        &self,
        request: &EnsureRequest,
        repository: &str,
        image_ref: &str,
    ) -> Result<bool, EnsureError> {
        let VerificationConfig { policy, allowlist } = &self.verification;
        let checked = |result: CheckResult| {
            self.records.metrics().checked(result);
            result == CheckResult::CredentialPolicyAllowed || result == CheckResult::CredentialRecordFound
        };
        let unreadable = |error: RecordsError| {
            tracing::warn!(%error, "Unable to access cache records about image pulls");
            checked(CheckResult::Error)
        };
        // Only this policy asks whether cri-imaged pulled the image.
        let pulled_by_us = match policy {
            VerificationPolicy::NeverVerifyPreloadedImages => {
                match self.records.pulled_by_cri_imaged(&request.image, image_ref).await {
                    Ok(pulled) => pulled,
                    Err(error) => return Ok(unreadable(error)),
                }
            }
            _ => false,
        };
        if !verification::requires_verification(*policy, allowlist, repository, pulled_by_us) {
            return Ok(checked(CheckResult::CredentialPolicyAllowed));
        }
        let record = match self.records.record(image_ref).await {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(checked(CheckResult::MustAuthenticate)),
            Err(error) => return Ok(unreadable(error)),
        };
        // The pod's account and secrets are looked up only when the record holds some to compare
        // them with, the account first: once it matches, the secrets are not read.
        let recorded = record.credential_mapping.get(repository).filter(|recorded| !recorded.node_pods_accessible);
        let pod_account = match recorded {
            Some(recorded) if !recorded.kubernetes_service_accounts.is_empty() => {
                self.pod_account(request, repository).await
            }
            _ => None,
        };
        let account_recorded = recorded
            .zip(pod_account.as_ref())
            .is_some_and(|(recorded, account)| recorded.kubernetes_service_accounts.contains(account));
        let needs_secrets =
            !account_recorded && recorded.is_some_and(|recorded| !recorded.kubernetes_secrets.is_empty());
        let pod_secrets = if needs_secrets { self.pod_secret_records(request, repository)? } else { Vec::new() };
        match check::check(&record, repository, pod_account.as_ref(), &pod_secrets) {
            check::Verdict::Allowed { remember } => {
                if let Some(secret) = remember
                    && let Err(error) = self.records.remember(image_ref, repository, secret).await
                {
                    tracing::warn!(%error, "failed to write an image pulled record");
                }
                Ok(checked(CheckResult::CredentialRecordFound))
            }
            check::Verdict::MustAuthenticate => Ok(checked(CheckResult::MustAuthenticate)),
        }
    }

    /// The service account a credential-provider plugin now gives the pod credentials for
    /// `repository` under, as the kubelet finds it: from the plugins' answer (cached in the steady
    /// state), the first credential given with a token. A pod has one service account.
    async fn pod_account(&self, request: &EnsureRequest, repository: &str) -> Option<ServiceAccountRecord> {
        let account = request.service_account.as_ref()?;
        let found = self.node_credentials.lookup(repository, Some(account)).await;
        found.iter().find_map(|credential| match &credential.source {
            CredentialSource::Plugin { account: Some(account), .. } => Some(account_record(account)),
            _ => None,
        })
    }

    /// The pod's secrets that apply to `repository`, each with the kubelet's credential hash.
    fn pod_secret_records(&self, request: &EnsureRequest, repository: &str) -> Result<Vec<SecretRecord>, EnsureError> {
        let keyring = self.prepared_secrets.keyring_for(repository, &request.pull_secrets).map_err(|source| {
            tracing::warn!(error = %source, "pull secret refused");
            EnsureError::InvalidPullSecret { source }
        })?;
        let found = keyring.lookup(repository);
        Ok(found
            .iter()
            .filter_map(|credential| match &credential.source {
                CredentialSource::Secret(coordinates) => Some(secret_record(coordinates, &credential.auth)),
                CredentialSource::NodeConfig | CredentialSource::Plugin { .. } => None,
            })
            .collect())
    }
}
