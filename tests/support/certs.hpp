// Throwaway certificate authorities and certificates for TLS tests, made with OpenSSL at test
// time in a fresh directory (removed by the destructor). Keys are P-256.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace ordo::test {

class tls_files {
  public:
    std::string dir;
    std::string ca;                       // the CA everyone below trusts
    std::string server_cert, server_key;  // CN=localhost, SAN localhost and 127.0.0.1
    std::string client_cert, client_key;  // CN=ordo-test-client
    std::string other_ca;                 // a CA that signed nothing here
    std::string expired_cert, expired_key;  // signed by `ca`, expired an hour ago

    tls_files() {
        char tmpl[] = "/tmp/ordo-tls-XXXXXX";
        if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        dir = tmpl;
        key_ptr ca_key = new_key(), other_key = new_key(), srv_key = new_key(),
                cli_key = new_key(), old_key = new_key();
        x509_ptr ca_x = make_cert(ca_key.get(), "ordo test CA", nullptr, nullptr, true, 0, day);
        x509_ptr other_x =
            make_cert(other_key.get(), "ordo other CA", nullptr, nullptr, true, 0, day);
        x509_ptr srv_x =
            make_cert(srv_key.get(), "localhost", ca_x.get(), ca_key.get(), false, 0, day);
        x509_ptr cli_x = make_cert(cli_key.get(), "ordo-test-client", ca_x.get(), ca_key.get(),
                                   false, 0, day);
        x509_ptr old_x = make_cert(old_key.get(), "localhost", ca_x.get(), ca_key.get(), false,
                                   -2 * day, -3600);
        ca = write_cert("ca.pem", ca_x.get());
        other_ca = write_cert("other-ca.pem", other_x.get());
        server_cert = write_cert("server.pem", srv_x.get());
        server_key = write_key("server.key", srv_key.get());
        client_cert = write_cert("client.pem", cli_x.get());
        client_key = write_key("client.key", cli_key.get());
        expired_cert = write_cert("expired.pem", old_x.get());
        expired_key = write_key("expired.key", old_key.get());
    }

    ~tls_files() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }

    tls_files(const tls_files&) = delete;
    tls_files& operator=(const tls_files&) = delete;

    /// URL parameters for a server with this CA's certificate.
    std::string server_params() const { return "?cert=" + server_cert + "&key=" + server_key; }
    /// URL parameters for a client that trusts this CA.
    std::string client_params() const { return "?ca=" + ca; }

  private:
    static constexpr long day = 24 * 3600;
    struct key_free {
        void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
    };
    struct x509_free {
        void operator()(X509* x) const { X509_free(x); }
    };
    using key_ptr = std::unique_ptr<EVP_PKEY, key_free>;
    using x509_ptr = std::unique_ptr<X509, x509_free>;

    static key_ptr new_key() {
        key_ptr k(EVP_EC_gen("P-256"));
        if (!k) throw std::runtime_error("EVP_EC_gen failed");
        return k;
    }

    static void add_ext(X509* x, X509* issuer, int nid, const char* value) {
        X509V3_CTX ctx;
        X509V3_set_ctx(&ctx, issuer ? issuer : x, x, nullptr, nullptr, 0);
        X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
        if (!e) throw std::runtime_error("bad certificate extension");
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }

    static x509_ptr make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key,
                              bool is_ca, long not_before, long not_after) {
        static long serial = 1;
        x509_ptr x(X509_new());
        X509_set_version(x.get(), 2);
        ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial++);
        X509_gmtime_adj(X509_getm_notBefore(x.get()), not_before);
        X509_gmtime_adj(X509_getm_notAfter(x.get()), not_after);
        X509_set_pubkey(x.get(), key);
        X509_NAME* name = X509_get_subject_name(x.get());
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
        X509_set_issuer_name(x.get(), issuer ? X509_get_subject_name(issuer) : name);
        add_ext(x.get(), issuer, NID_subject_key_identifier, "hash");
        if (is_ca) {
            add_ext(x.get(), issuer, NID_basic_constraints, "critical,CA:TRUE");
            add_ext(x.get(), issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
        } else {
            add_ext(x.get(), issuer, NID_basic_constraints, "critical,CA:FALSE");
            add_ext(x.get(), issuer, NID_key_usage, "critical,digitalSignature");
            add_ext(x.get(), issuer, NID_ext_key_usage, "serverAuth,clientAuth");
            add_ext(x.get(), issuer, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
            add_ext(x.get(), issuer, NID_authority_key_identifier, "keyid");
        }
        if (!X509_sign(x.get(), issuer_key ? issuer_key : key, EVP_sha256()))
            throw std::runtime_error("X509_sign failed");
        return x;
    }

    std::string write_cert(const char* name, X509* x) const {
        const std::string path = dir + "/" + name;
        FILE* f = std::fopen(path.c_str(), "w");
        if (!f || !PEM_write_X509(f, x)) throw std::runtime_error("cannot write " + path);
        std::fclose(f);
        return path;
    }

    std::string write_key(const char* name, EVP_PKEY* k) const {
        const std::string path = dir + "/" + name;
        FILE* f = std::fopen(path.c_str(), "w");
        if (!f || !PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr))
            throw std::runtime_error("cannot write " + path);
        std::fclose(f);
        return path;
    }
};

}  // namespace ordo::test
