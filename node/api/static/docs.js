// Swagger UI for /docs, served from this node (no CDN).
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"});
});
