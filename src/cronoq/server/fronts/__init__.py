"""The fronts: what answers on the server's ports, each over the same handlers the services
registered. grpcio (`grpcio`) or the native transport (`native`) on the gRPC port, gRPC-Web in
front of grpcio (`grpcweb`), the HTTP listener's JSON API (`http_api`, shapes in
`json_messages`, a misdirected gRPC client answered by `misdirected`) and the dashboard's routes
(`dashboard`). They share `calls` (a servicer context for calls grpcio does not serve), `host`
(what they read of the app, as Protocols), `routes` (the HTTP route table's row) and `preface`
(HTTP/2 or not); no front imports another, nor the app."""
