//! containerd's content and lease services as the CRI client calls them, in the CRI plugin's
//! namespace: the blobs a pull writes (progress), and the leases that keep a pre-pull's downloads.

use std::{collections::HashMap, time::SystemTime};

use super::{
    ContentStore, CriClient, Held, RuntimeError,
    containerd::{
        content,
        leases::{
            self, AddResourceRequest, CreateRequest, DeleteRequest, ListRequest, ListResourcesRequest,
            leases_client::LeasesClient,
        },
    },
};

/// `text` with the characters of a regular expression escaped, for a containerd `~=` filter:
/// the value is a Go quoted string, so each escaping backslash is written twice.
fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            escaped.push_str("\\\\");
        }
        escaped.push(c);
    }
    escaped
}

/// The label containerd's collector reads a lease's end from.
const EXPIRE_LABEL: &str = "containerd.io/gc.expire";

impl CriClient {
    fn leases_client(&self) -> LeasesClient<tonic::transport::Channel> {
        LeasesClient::new(self.channel())
    }
}

impl ContentStore for CriClient {
    async fn list_ingests(&self) -> Result<Vec<(String, u64, u64)>, RuntimeError> {
        let request = self.content_request(content::ListStatusesRequest { filters: Vec::new() });
        let response = self.bounded(self.content().list_statuses(request)).await?;
        let size = |value: i64| u64::try_from(value).unwrap_or(0);
        Ok(response
            .statuses
            .into_iter()
            .map(|status| (status.r#ref, size(status.offset), size(status.total)))
            .collect())
    }

    async fn find_manifest(
        &self,
        host: &str,
        repository: &str,
        since: SystemTime,
    ) -> Result<Option<String>, RuntimeError> {
        // Manifests (not indexes: only a manifest names a config) whose source is the repository.
        let filter = format!(
            r#"labels."containerd.io/distribution.source.{host}"~="(^|,){}(,|$)",labels."containerd.io/gc.ref.content.config""#,
            regex_escape(repository)
        );
        let request = self.content_request(content::ListContentRequest { filters: vec![filter] });
        let call = async {
            let mut stream = self.content().list(request).await?.into_inner();
            let mut newest: Option<(SystemTime, String)> = None;
            while let Some(batch) = stream.message().await? {
                for info in batch.info {
                    let created = info.created_at.and_then(|at| SystemTime::try_from(at).ok());
                    if let Some(created) = created.filter(|created| *created >= since)
                        && newest.as_ref().is_none_or(|(at, _)| created > *at)
                    {
                        newest = Some((created, info.digest));
                    }
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new(newest.map(|(_, digest)| digest)))
        };
        self.bounded(call).await
    }

    async fn read_blob(&self, digest: &str, limit: usize) -> Result<Vec<u8>, RuntimeError> {
        let request =
            self.content_request(content::ReadContentRequest { digest: digest.to_owned(), offset: 0, size: 0 });
        let call = async {
            let mut stream = self.content().read(request).await?.into_inner();
            let mut data = Vec::new();
            while let Some(chunk) = stream.message().await? {
                if data.len() + chunk.data.len() > limit {
                    return Err(tonic::Status::resource_exhausted(format!(
                        "blob {digest} is larger than {limit} bytes"
                    )));
                }
                data.extend_from_slice(&chunk.data);
            }
            Ok(tonic::Response::new(data))
        };
        self.bounded(call).await
    }

    async fn has_blob(&self, digest: &str) -> Result<bool, RuntimeError> {
        let request = self.content_request(content::InfoRequest { digest: digest.to_owned() });
        match self.bounded(self.content().info(request)).await {
            Ok(_) => Ok(true),
            Err(RuntimeError::Status(status)) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn create_lease(&self, id: &str, expires: SystemTime) -> Result<(), RuntimeError> {
        let expires = crate::duration::rfc3339(expires);
        let labels = HashMap::from([(EXPIRE_LABEL.to_owned(), expires)]);
        let request = self.content_request(CreateRequest { id: id.to_owned(), labels });
        match self.bounded(self.leases_client().create(request)).await {
            Err(RuntimeError::Status(status)) if status.code() == tonic::Code::AlreadyExists => Ok(()),
            result => result.map(drop),
        }
    }

    async fn hold(&self, id: &str, held: &[Held]) -> Result<(), RuntimeError> {
        for held in held {
            let (resource, kind) = match held {
                Held::Blob(digest) => (digest, "content"),
                Held::Download(reference) => (reference, "ingests"),
            };
            let resource = leases::Resource { id: resource.clone(), r#type: kind.to_owned() };
            let request = self.content_request(AddResourceRequest { id: id.to_owned(), resource: Some(resource) });
            self.bounded(self.leases_client().add_resource(request)).await?;
        }
        Ok(())
    }

    async fn held(&self, id: &str) -> Result<Vec<Held>, RuntimeError> {
        let request = self.content_request(ListResourcesRequest { id: id.to_owned() });
        let response = self.bounded(self.leases_client().list_resources(request)).await?;
        Ok(response
            .resources
            .into_iter()
            .filter_map(|resource| match resource.r#type.as_str() {
                "content" => Some(Held::Blob(resource.id)),
                "ingests" => Some(Held::Download(resource.id)),
                _ => None,
            })
            .collect())
    }

    async fn delete_lease(&self, id: &str) -> Result<(), RuntimeError> {
        let request = self.content_request(DeleteRequest { id: id.to_owned(), sync: false });
        match self.bounded(self.leases_client().delete(request)).await {
            Err(RuntimeError::Status(status)) if status.code() == tonic::Code::NotFound => Ok(()),
            result => result.map(drop),
        }
    }

    async fn leases(&self, prefix: &str) -> Result<Vec<String>, RuntimeError> {
        let request = self.content_request(ListRequest { filters: Vec::new() });
        let response = self.bounded(self.leases_client().list(request)).await?;
        Ok(response.leases.into_iter().map(|lease| lease.id).filter(|id| id.starts_with(prefix)).collect())
    }
}
