"""Accounts: who is asking (`identity`), and writes only the page can make (`cross_site`).

`AUTH_MODE` says whom the app believes (docs/deploy.md, "Sign-in"):

- `none` (the default): one local user, `local`; identity headers are ignored, whoever sends
  them. For a machine of one's own, or a site with no accounts.
- `appservice`: App Service's Easy Auth signs people in and sends `X-MS-CLIENT-PRINCIPAL-ID`
  (and `-NAME`) with every request; its front end strips those headers from what clients send,
  so they are trusted as they come. A request without them is a 401.
- `header`: a reverse proxy (oauth2-proxy, say) signs people in and sends the user in
  `AUTH_HEADER`; trusted only on a connection from one of `TRUSTED_PROXIES` (the proxy's
  addresses), so a client that reaches the app directly cannot name anyone. Others are a 401.

The user of a request is made on first sight (`chatapp.store.users.ensure_user`) and kept in
`flask.g` for the request (`current_user`). Subjects are kept with their mode's prefix
(`appservice:ID`, `header:NAME`, `local`), so changing modes never hands one person's chats to
another.
"""

from chatapp.accounts.identity import CurrentUser, current_user, install

__all__ = ["CurrentUser", "current_user", "install"]
