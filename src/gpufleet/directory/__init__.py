"""Users from the site's directory: LDAP (OpenLDAP, 389 DS / FreeIPA, Active Directory) and OpenID Connect
single sign-on, mapped onto gpufleet's users, roles and project memberships."""
