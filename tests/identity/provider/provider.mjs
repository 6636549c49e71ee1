// A real OpenID provider for the identity tests: the certified `oidc-provider` package on
// loopback, with its development sign-in pages (any password; the login names the account).
// Accounts are read from a JSON file at every lookup, so a test changes a person's groups or
// disables them between two sign-ins: {"ada": {"email": "...", "groups": [...], "disabled": false}}.
// Usage: node provider.mjs PORT CONFIG.json  (CONFIG: client_id, client_secret, redirect_uri,
// accounts: the accounts file). Prints "ready ISSUER" once it listens.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, configPath] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configPath, 'utf8'));
const issuer = `http://127.0.0.1:${port}`;

function account(id) {
  const found = JSON.parse(readFileSync(config.accounts, 'utf8'))[id];
  return found && !found.disabled ? found : undefined;
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: config.client_id,
      client_secret: config.client_secret,
      redirect_uris: [config.redirect_uri],
      token_endpoint_auth_method: 'client_secret_post',
    },
  ],
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  async findAccount(ctx, id) {
    const found = account(id);
    if (!found) return undefined; // disabled or unknown: no token, no userinfo
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          email: found.email,
          email_verified: true,
          preferred_username: id,
          name: id,
          groups: found.groups || [],
        };
      },
    };
  },
  features: { devInteractions: { enabled: true } },
});
provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => console.log(`ready ${issuer}`));
