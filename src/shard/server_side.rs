//! The client side of KEP-5866: kube's watcher has no `shardSelector` parameter, so a shard's
//! controller gets a client that adds it to every list and watch of the collections it
//! follows, and `run` asks the API server once whether it honours the parameter at all (one
//! without the feature gate ignores it and would give every shard every object).

use http::{Method, Request, Uri};
use kube::{Client, client::Body};
use serde_json::Value;

use super::ranges::{Range, TOP, selector};

/// The collections the controller lists and watches: MyApps, Deployments, Services.
const COLLECTIONS: &[&str] = &["myapps", "deployments", "services"];

/// `client`, with `shardSelector` for `ranges` added to each list and watch of the
/// controller's collections; every other request goes out unchanged.
pub fn selecting(client: Client, ranges: &[Range]) -> Client {
    let selector = selector(ranges);
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let client = client.clone();
        if let Some(uri) = with_selector(request.method(), request.uri(), &selector) {
            *request.uri_mut() = uri;
        }
        async move { client.send(request).await }
    });
    Client::new(service, namespace)
}

/// The URI with `shardSelector` added, for a GET of one of [`COLLECTIONS`].
fn with_selector(method: &Method, uri: &Uri, selector: &str) -> Option<Uri> {
    let collection = uri.path().rsplit('/').next()?;
    if method != Method::GET || !COLLECTIONS.contains(&collection) {
        return None;
    }
    let mut query = uri.query().map(str::to_owned).unwrap_or_default();
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    serializer.append_pair("shardSelector", selector);
    if !query.is_empty() {
        query.push('&');
    }
    query.push_str(&serializer.finish());
    format!("{}?{query}", uri.path()).parse().ok()
}

/// Whether the API server filters lists by `shardSelector`: a list of at most one MyApp with
/// a selector of the whole space answers with `metadata.shardInfo` only where it does.
pub async fn supported(client: &Client) -> Result<bool, kube::Error> {
    let uri = with_selector(
        &Method::GET,
        &"/apis/example.com/v1/myapps?limit=1"
            .parse()
            .expect("a valid URI"),
        &selector(&[(0, TOP)]),
    )
    .expect("a list of MyApps");
    let request = Request::get(uri)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let list: Value = client.request(request).await?;
    Ok(list.pointer("/metadata/shardInfo").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_watches_of_the_controllers_collections_get_the_selector_and_nothing_else() {
        let selected = |method: Method, uri: &str| {
            with_selector(&method, &uri.parse().unwrap(), "shardRange(x, '0', '1')")
                .map(|uri| uri.to_string())
        };
        assert_eq!(
            selected(
                Method::GET,
                "/apis/example.com/v1/myapps?labelSelector=a%3Db&watch=true"
            )
            .as_deref(),
            Some(
                "/apis/example.com/v1/myapps?labelSelector=a%3Db&watch=true&shardSelector=shardRange%28x%2C+%270%27%2C+%271%27%29"
            )
        );
        assert!(
            selected(Method::GET, "/apis/apps/v1/deployments")
                .unwrap()
                .ends_with("/deployments?shardSelector=shardRange%28x%2C+%270%27%2C+%271%27%29")
        );
        assert!(selected(Method::GET, "/api/v1/services?limit=500").is_some());
        // Reads of one object, writes, and other collections go out as they are.
        assert_eq!(
            selected(Method::GET, "/apis/example.com/v1/namespaces/a/myapps/web"),
            None
        );
        assert_eq!(
            selected(Method::PATCH, "/apis/apps/v1/namespaces/a/deployments"),
            None
        );
        assert_eq!(
            selected(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases"
            ),
            None
        );
    }
}
